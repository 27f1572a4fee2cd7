"""Llama-style decoder blocks: the math of each option against a plain reference, the
presets' parameter counts against their published ones, and the planner's counts of a
Llama block (collectives, memory) against a measured run on CPU ranks.

Parity of training with one device under ddp, fsdp, tp and pp: tests/test_composed.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import labkit
import labkit.plan as plan
from labkit.models import LLAMA3_8B, PUBLISHED_SHAPES, GPTConfig, build_model, count_parameters
from labkit.models.gpt import SelfAttention, rotary
from labkit.plan.counts import sample_counts
from labkit.plan.parallelism import Parallelism
from labkit.plan.step import Lever, decoder_memory, local_params, step_comm
from labkit.training.estimate import estimate_memory
from labkit.training.layout import Layout
from labkit.training.run import resolve

LLAMA = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=2, mlp="swiglu",
                  d_ff=96, n_kv_heads=2, norm="rmsnorm", position="rope", bias=False)


# ----- the blocks --------------------------------------------------------------------------
def test_grouped_query_attention_is_multi_head_attention_with_shared_key_values():
    """A GQA layer equals an MHA layer whose every query head's key/value weights are its
    group's (the kv rows repeated), the GQA rows read group after group."""
    gqa_config = dataclasses.replace(LLAMA, position="learned")
    gqa = SelfAttention(gqa_config)
    mha = SelfAttention(dataclasses.replace(gqa_config, n_kv_heads=None))
    d_head, group = gqa_config.d_head, gqa.group
    rows = gqa.qkv.weight.view(gqa_config.kv_heads, group + 2, d_head, -1)
    q = rows[:, :group].reshape(-1, gqa_config.d_model)
    k = rows[:, group].repeat_interleave(group, dim=0).reshape(-1, gqa_config.d_model)
    v = rows[:, group + 1].repeat_interleave(group, dim=0).reshape(-1, gqa_config.d_model)
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([q, k, v]))
        mha.proj.weight.copy_(gqa.proj.weight)
    x = torch.randn(2, gqa_config.seq_len, gqa_config.d_model)
    torch.testing.assert_close(gqa(x), mha(x))


def test_rotary_scores_depend_on_the_distance_between_positions_only():
    q = torch.randn(1, 1, 1, 16).expand(1, 1, 12, 16)  # the same vector at every position
    k = torch.randn(1, 1, 1, 16).expand(1, 1, 12, 16)
    scores = rotary(q, 10_000.0) @ rotary(k, 10_000.0).transpose(-1, -2)  # (12, 12)
    for shift in range(1, 4):
        torch.testing.assert_close(scores[0, 0, shift:, shift:], scores[0, 0, :-shift, :-shift])
    assert not torch.allclose(scores[0, 0, 0, 0], scores[0, 0, 0, 5])


def test_swiglu_and_tied_embeddings_count_their_parameters():
    d, ff, v, layers = LLAMA.d_model, LLAMA.d_ff, LLAMA.vocab_size, LLAMA.n_layers
    kv = LLAMA.kv_heads * LLAMA.d_head
    block = d * (d + 2 * kv) + d * d + 3 * d * ff + 2 * d  # attention, SwiGLU, two RMSNorms
    assert count_parameters(LLAMA) == layers * block + 2 * v * d + d
    tied = dataclasses.replace(LLAMA, tie_embeddings=True)
    model = build_model(tied)
    assert count_parameters(tied) == count_parameters(LLAMA) - v * d
    assert not list(model.head.parameters()) and model.head(torch.ones(1, d)).shape == (1, v)


def test_bad_block_options_are_clear_errors():
    with pytest.raises(ValueError, match="mlp"):
        GPTConfig(mlp="relu")
    with pytest.raises(ValueError, match="n_kv_heads .3. must divide n_heads .4."):
        GPTConfig(n_kv_heads=3)
    with pytest.raises(TypeError, match="bias"):
        GPTConfig(bias=0)


def test_tp_must_divide_the_key_value_heads():
    config = dataclasses.replace(LLAMA, n_heads=8, n_kv_heads=2)
    train = labkit.TrainConfig(model=config, global_batch=8, layout=Layout(tp=4))
    with pytest.raises(ValueError, match=r"tp must divide n_kv_heads \(2\): choose tp in \[1, 2\]"):
        resolve(train.replace(layout=Layout(tp=4)), 4)
    with pytest.raises(plan.PlanError, match="n_kv_heads"):
        plan.project(config, Layout(tp=4), plan.Cluster("H100", gpus_per_node=4), 8)
    resolve(train.replace(layout=Layout(tp=2)), 2)  # 2 divides 2


def test_tied_embeddings_refuse_a_pipeline():
    tied = dataclasses.replace(LLAMA, tie_embeddings=True)
    layout = Layout(pp=2)
    with pytest.raises(ValueError, match="tie_embeddings=False with pp"):
        resolve(labkit.TrainConfig(model=tied, global_batch=8, micro_batches=2,
                                   layout=layout), 2)


def test_fused_kernels_keep_less_of_a_llama_block_and_nothing_changes_for_a_gpt():
    from labkit.plan.blocks import block_counts

    gpt = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=2)
    assert block_counts(gpt, 2, True, True) == block_counts(gpt, 2, True, False)
    fused, eager = block_counts(LLAMA, 2, True, True), block_counts(LLAMA, 2, True, False)
    assert fused.params == eager.params and fused.saved_bytes < eager.saved_bytes
    # each RMSNorm keeps its input, not its normalized input: two d_model-wide tensors less
    tokens = LLAMA.seq_len * 4  # fp32 bytes per value
    assert eager.full_width_bytes - fused.full_width_bytes == 2 * tokens * LLAMA.d_model


# ----- the presets -------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(PUBLISHED_SHAPES))
def test_presets_count_their_published_parameters(name):
    config, source, published = PUBLISHED_SHAPES[name]
    assert source and abs(count_parameters(config) / published - 1) < 0.005


def test_llama3_8b_counts_8_03_billion_in_the_planner_too():
    assert round(count_parameters(LLAMA3_8B) / 1e7) == 803
    assert sample_counts(LLAMA3_8B).params == count_parameters(LLAMA3_8B)
    assert local_params(LLAMA3_8B, Parallelism.of()) == count_parameters(LLAMA3_8B)


# ----- the planner's counts against a measured run -----------------------------------------
LAYOUTS = [(Parallelism.of(dp=2, dp_kind="ddp"), 1, False), (Parallelism.of(fsdp=2), 1, False),
           (Parallelism.of(tp=2), 1, False), (Parallelism.of(tp=2), 1, True),
           (Parallelism.of(pp=2, schedule="1f1b"), 2, False)]


def test_llama_collective_bytes_equal_a_measured_run(two):
    """SwiGLU's gate and up are two column layers: two backward AllReduces where the GPT's
    MLP has one; the fused qkv of grouped-query attention keeps one."""
    for layout, micro, ckpt in LAYOUTS:
        report = labkit.train(two, model=LLAMA, **layout.config_fields(), global_batch=8,
                              steps=2, micro_batches=micro, estimate=False,
                              activation_checkpointing=ckpt)
        measured = {(dim, kind): (c["calls"], c["bytes"])
                    for dim, kinds in report.comm_by_dim().items()
                    for kind, c in kinds.items() if kind != "recv"}
        counted = step_comm(LLAMA, layout, Lever(8, micro, "fp32", ckpt),
                            local_params(LLAMA, layout), measured=True)
        assert {k: (round(c), round(b)) for k, (c, b) in counted.items()} == measured, (
            layout, ckpt)


@pytest.mark.parametrize("layout", [Parallelism.of(fsdp=2), Parallelism.of(tp=2),
                                    Parallelism.of(pp=2, schedule="1f1b")])
def test_llama_memory_per_block_brackets_the_traced_estimate(layout):
    config = dataclasses.replace(LLAMA, n_layers=4)
    micro = 2 if layout.pipelined else 1
    counted = sum(decoder_memory(config, layout, Lever(16, micro, "fp32"), measured=True,
                                 flash_attention=False).values())
    traced = estimate_memory(labkit.TrainConfig(model=config, **layout.config_fields(),
                                                global_batch=16, micro_batches=micro),
                             layout.size).peak_bytes
    assert 0.95 * traced <= counted <= 1.4 * traced
