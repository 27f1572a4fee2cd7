"""The mixture-of-experts GPT and expert parallelism (labkit/models/moe.py,
labkit/parallel/expert): routing equal to a token-by-token reference, experts spread over
the dp ranks training exactly as one device (losses, SGD weights, expert load), all-to-all
bytes per step equal to the formula, the estimate traced through the all-to-alls equal to
the measured peak, and the layouts refused before any rank starts."""

from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import labkit
from labkit.models import MoEGPTConfig
from labkit.models.moe import MoE
from labkit.parallel.expert import dropped_tokens, expert_load
from labkit.parallel.expert.observe import dropped_by_expert
from labkit.runtime.costs import moe_all_to_all_bytes
from labkit.training.layout import Layout
from labkit.training.run import resolve
from tests.conftest import assert_trains_as

MOE = MoEGPTConfig(vocab_size=64, seq_len=16, d_model=32, n_heads=2, n_layers=2, n_experts=4,
                   top_k=2, capacity_factor=1.0)
SGD = dict(global_batch=4, steps=3, optimizer="sgd", lr=0.1, return_weights=True)


def _token_by_token(layer: MoE, x: torch.Tensor) -> torch.Tensor:
    """The MoE layer written as a loop over tokens, capacity counted per sequence with
    first choices served first."""
    config, (batch, seq, _) = layer.config, x.shape
    probs = torch.softmax(layer.router(x), dim=-1)
    weight, expert = probs.topk(config.top_k, dim=-1)
    if config.top_k > 1:
        weight = weight / weight.sum(-1, keepdim=True)
    w1, b1, w2, b2 = layer.experts.w1, layer.experts.b1, layer.experts.w2, layer.experts.b2
    out = torch.zeros_like(x)
    for b in range(batch):
        taken = [0] * config.n_experts
        for j in range(config.top_k):
            for s in range(seq):
                e = int(expert[b, s, j])
                if taken[e] == config.capacity():
                    continue
                taken[e] += 1
                hidden = F.gelu(x[b, s] @ w1[e] + b1[e])
                out[b, s] += weight[b, s, j] * (hidden @ w2[e] + b2[e])
    return out


def test_top_1_router_learns_from_the_language_model_loss():
    # Switch's top-1 weighs the expert's output by its probability; renormalised to 1 the
    # router would learn from the auxiliary loss alone
    config = MOE.__class__(**{**MOE.__dict__, "top_k": 1, "aux_loss_weight": 0.0})
    layer, x = MoE(config), torch.randn(2, config.seq_len, config.d_model)
    torch.testing.assert_close(layer(x), _token_by_token(layer, x))
    layer(x).pow(2).sum().backward()
    assert layer.router.weight.grad.abs().max() > 1e-3


def test_routing_equals_a_token_by_token_loop_and_drops_over_capacity():
    torch.manual_seed(0)
    for factor in (0.5, 1.0, 2.0):
        layer = MoE(MOE.__class__(**{**MOE.__dict__, "capacity_factor": factor}))
        x = torch.randn(3, MOE.seq_len, MOE.d_model)
        torch.testing.assert_close(layer(x), _token_by_token(layer, x))
        load, dropped = layer.stats["load"], int(layer.stats["dropped"])
        assert int(load.sum()) + dropped == 3 * MOE.seq_len * MOE.top_k
        assert int(load.max()) <= 3 * layer.config.capacity()
        chosen = F.one_hot(layer.router(x).topk(MOE.top_k, dim=-1).indices, MOE.n_experts)
        over = layer.stats["dropped_by_expert"]  # (n_experts,): each expert's choices over
        assert torch.equal(load + over, chosen.sum((0, 1, 2))) and int(over.sum()) == dropped
        if factor == 0.5:
            assert dropped > 0


@pytest.fixture(scope="module")
def reference(four):
    with four.resized(1):
        return labkit.train(four, labkit.TrainConfig(model=MOE, **SGD))


@pytest.mark.parametrize("layout", [Layout(dp=2, ep=2), Layout(dp=4, ep=4), Layout(dp=2)],
                         ids=str)
def test_experts_over_ranks_train_as_one_device(four, reference, layout):
    with four.resized(layout.size):
        report = labkit.train(four, labkit.TrainConfig(model=MOE, layout=layout, **SGD))
    assert_trains_as(reference, report)
    assert expert_load(report) == expert_load(reference)  # the same tokens, the same choices
    assert dropped_tokens(report) == dropped_tokens(reference)
    assert dropped_by_expert(report) == dropped_by_expert(reference)
    routed = SGD["global_batch"] * MOE.seq_len * MOE.top_k
    for step in expert_load(report):
        assert all(sum(layer) <= routed for layer in step)
    for rank, peak in enumerate(report.peak_bytes):
        assert abs(peak - report.estimate["peak_bytes"]) <= 0.02 * peak, (rank, peak)
    if layout.ep == 1:
        assert "all_to_all" not in report.comm_by_dim().get("dp", {})
        return
    moved = report.comm_by_dim()["dp"]["all_to_all"]
    batch = SGD["global_batch"] // layout.dp
    formula = moe_all_to_all_bytes(MOE.n_layers, MOE.n_experts, batch, MOE.capacity(),
                                   MOE.d_model)
    assert moved["calls"] == 4 * MOE.n_layers and moved["bytes"] == formula
    assert moved["wire_bytes"] == formula * (layout.dp - 1) / layout.dp


@pytest.mark.parametrize("model, degrees, match", [
    ("gpt", dict(dp=2, ep=2), "has none"),
    (MOE, dict(dp=4, ep=2), r"must equal dp \(here 4\).*Layout\(dp=4, ep=4\)"),
    (MOE, dict(dp=2, ep=2, engines=dict(dp_kind="ddp")), "dp_kind='ddp' cannot run it"),
    (MoEGPTConfig(n_experts=3), dict(dp=2, ep=2), "multiple of 2"),
    (MOE, dict(tp=2), "not by tensors"),
    (MOE, dict(cp=2), "dense 'gpt'"),
])
def test_expert_layouts_refused_before_any_rank_starts(model, degrees, match):
    with pytest.raises(ValueError, match=match):
        engines = degrees.pop("engines", {})
        layout = Layout(**degrees)
        config = labkit.TrainConfig(model=model, layout=layout, global_batch=4, **engines)
        resolve(config, layout.size)


def test_moe_refuses_micro_steps():
    layout = Layout(dp=2, ep=2)
    config = labkit.TrainConfig(model=MOE, layout=layout, global_batch=8, grad_accumulation=2)
    with pytest.raises(ValueError, match="one micro-step"):
        resolve(config.replace(layout=layout), 2)


def test_forward_flops_per_token_count_attention():
    # per token and layer: q, k, v, out projections 2 x 4 d^2, MLP 2 x 8 d^2, attention's
    # q k^T and p v 2 x 2 x seq x d (the math kernel's whole square); the head 2 x d x vocab
    from labkit.lessons.long_context.compare import forward_flops_per_token
    from labkit.models import GPTConfig

    d, seq, vocab, layers = 32, 64, 64, 2
    dense = GPTConfig(vocab_size=vocab, seq_len=seq, d_model=d, n_heads=2, n_layers=layers)
    per_layer = 2 * 4 * d * d + 2 * 8 * d * d + 4 * seq * d
    assert forward_flops_per_token(dense) == layers * per_layer + 2 * d * vocab
