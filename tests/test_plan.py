"""labkit.plan: the sourced hardware table, counted costs (scaled counts equal whole counts,
collectives equal a measured run's), the time model's placement of links, the search, and the
memory verdicts of published training runs."""

from __future__ import annotations

import dataclasses

import pytest

import labkit
import labkit.plan as plan
from labkit.models import GPT_70B, DLRMConfig, GPTConfig
from labkit.plan.counts import sample_counts, traced_sample_counts
from labkit.plan.parallelism import Parallelism
from labkit.plan.step import Lever, decoder_memory, local_params, step_comm
from labkit.training.estimate import estimate_memory
from labkit.training.layout import Layout

SMALL = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=2)


# ----- the table ---------------------------------------------------------------------------
def test_every_row_cites_a_datasheet_and_a_date():
    assert len(plan.GPUS) >= 9
    for row in plan.GPUS.values():
        assert row.source.startswith("https://"), row.name
        assert row.accessed and row.memory_bytes > 0 and row.bf16_flops >= row.fp32_flops > 0
        assert row.memory_bandwidth > 0 and row.intra_node_bandwidth > 0


def test_unknown_gpu_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown GPU 'H900'.*H100.*MI300X"):
        plan.GPUCluster("H900", gpus_per_node=8, nodes=4)
    cluster = plan.GPUCluster("H100", gpus_per_node=8, nodes=4)
    assert cluster.world_size == 32 and plan.GPUCluster("H100").gpus_per_node == 8
    with pytest.raises(ValueError, match="nodes=1"):
        plan.GPUCluster("RTX4090", nodes=2)


# ----- counted costs -----------------------------------------------------------------------
def test_counts_of_one_and_two_blocks_scale_to_the_whole_model():
    config = dataclasses.replace(SMALL, n_layers=5)
    assert sample_counts(config) == traced_sample_counts(config)


def test_flops_follow_six_n_per_token_for_a_decoder():
    counts = sample_counts(GPT_70B)  # 70B on meta tensors: counted, not assumed
    six_n = 6 * counts.params * GPT_70B.seq_len
    assert 1.0 < counts.flops / six_n < 1.1  # attention adds a few percent at 2048 tokens


def test_embedding_lookups_are_costed_in_bytes():
    config = DLRMConfig(num_tables=4, rows_per_table=1000, embedding_dim=16)
    counts = sample_counts(config)
    # each table: one row of 16 floats read forward, its gradient read backward
    assert counts.lookup_bytes == 4 * 16 * 4 * 2
    assert counts.table_bytes == 4 * 1000 * 16 * 4  # dense gradient of every table
    cluster = plan.GPUCluster("A100-80GB", gpus_per_node=1)
    projection = plan.project(config, Layout(), cluster, global_batch=4096, precision="fp32")
    assert projection.costs.memory_bound_bytes >= 4096 * counts.lookup_bytes


@pytest.mark.parametrize("layout", [Parallelism.of(fsdp=2), Parallelism.of(tp=2),
                                    Parallelism.of(pp=2, schedule="1f1b")])
def test_memory_per_block_brackets_the_traced_estimate(layout):
    """The search's per-block memory is never below the fake-tensor trace and at most 40%
    above (it adds categories' peaks that the trace sees at different moments)."""
    config = dataclasses.replace(SMALL, n_layers=4)
    micro = 2 if layout.pipelined else 1
    counted = sum(decoder_memory(config, layout, Lever(16, micro, "fp32"), measured=True,
                                 flash_attention=False).values())
    traced = estimate_memory(labkit.TrainConfig(model=config, **layout.config_fields(),
                                                global_batch=16,
                                                micro_batches=micro), layout.size).peak_bytes
    assert 0.95 * traced <= counted <= 1.4 * traced


LAYOUTS = [(Parallelism.of(dp=2, dp_kind="ddp"), 1, False), (Parallelism.of(fsdp=2), 1, False),
           (Parallelism.of(tp=2), 1, False), (Parallelism.of(tp=2), 1, True),
           (Parallelism.of(pp=2, schedule="1f1b"), 2, False)]


def test_collective_bytes_equal_a_measured_run():
    with labkit.Cluster(2, device="cpu") as cluster:
        for layout, micro, ckpt in LAYOUTS:
            report = labkit.train(cluster, model=SMALL, **layout.config_fields(), global_batch=8,
                                  steps=2, micro_batches=micro, estimate=False,
                                  activation_checkpointing=ckpt)
            measured = {(dim, kind): (c["calls"], c["bytes"])
                        for dim, kinds in report.comm_by_dim().items()
                        for kind, c in kinds.items() if kind != "recv"}
            counted = step_comm(SMALL, layout, Lever(8, micro, "fp32", ckpt),
                                local_params(SMALL, layout), measured=True)
            assert {k: (round(c), round(b)) for k, (c, b) in counted.items()} == measured, (
                layout, ckpt)


# ----- the time model and the search -------------------------------------------------------
def test_tensor_parallel_stays_in_a_node_and_data_parallel_crosses():
    cluster = plan.GPUCluster("H100", gpus_per_node=8, nodes=4)
    projection = plan.project(GPTConfig(vocab_size=32000, seq_len=2048, d_model=4096,
                                        n_heads=32, n_layers=32),
                              Layout(fsdp=4, tp=8), cluster, global_batch=64, micro_batches=4)
    assert projection.links == {"tp": "in-node", "fsdp": "network"}
    split = projection.split()
    assert split["step_s"] == pytest.approx(split["compute_s"] + split["exposed_comm_s"])
    assert 0 < projection.mfu < cluster.efficiency
    days = projection.time_to_train(tokens=1e12)
    assert days["gpu_hours"] == pytest.approx(days["seconds"] * 32 / 3600)
    with pytest.raises(plan.PlanError, match="cross nodes"):
        plan.project(SMALL, Layout(tp=16), plan.GPUCluster("H100", nodes=2), global_batch=16)
    with pytest.raises(plan.PlanError, match="uses 4 GPUs and the cluster"):
        plan.project(SMALL, Layout(dp=4), cluster, global_batch=16)


def test_pipeline_bubble_shrinks_with_micro_batches():
    cluster = plan.GPUCluster("H100", gpus_per_node=8, nodes=1)
    config = dataclasses.replace(SMALL, n_layers=8)
    few, many = (plan.project(config, Parallelism.of(pp=8, schedule="1f1b"), cluster,
                              global_batch=64, micro_batches=m) for m in (8, 64))
    assert few.bubble_s / few.compute_s == pytest.approx(7 / 8, rel=0.05)
    assert many.bubble_s / many.compute_s == pytest.approx(7 / 64, rel=0.05)


def test_search_returns_fits_fastest_first_and_reasons():
    result = plan.search(GPT_70B, plan.GPUCluster("H100", nodes=16), global_batch=256)
    assert result.fits and all(p.fits for p in result.fits)
    # fastest first within each group: the layouts without caveats, then pure bf16
    for group in (False, True):
        times = [p.step_s for p in result.fits if bool(p.caveats) is group]
        assert times == sorted(times)
    assert all(reason for _, reason in result.rejected)
    assert any("out of memory" in reason for _, reason in result.rejected)
    assert result.best.layout.tp <= 8
    nowhere = plan.search(GPT_70B, plan.GPUCluster("RTX4090", gpus_per_node=1), global_batch=8)
    with pytest.raises(plan.PlanError, match="no layout fits") as refused:
        _ = nowhere.best
    # the refusal says how far the leanest layout is from fitting, so the user can size up
    lean = nowhere.leanest
    leanest_by_hand = plan.project(GPT_70B, labkit.Layout(dp=1), lean.cluster, global_batch=8,
                                   micro_batches=8, precision="bf16",
                                   activation_checkpointing=True)
    assert not lean.fits and lean.peak_bytes == leanest_by_hand.peak_bytes
    usable = lean.cluster.gpu.usable_memory_bytes / 1e9
    assert f"needs {lean.peak_bytes / 1e9:.1f} GB per GPU of {usable:.1f} GB usable" in str(
        refused.value)


# ----- published runs: the planner's memory verdicts ---------------------------------------
def test_megatron_gpt3_175b_on_a100s_fits():
    """Narayanan et al. 2021 (Megatron-LM, Table 1): GPT 175B, 96 layers, hidden 12288, 96
    heads, TP 8 x PP 16 on 1536 A100-80GB (DP 12), batch 1536, sequence 2048, activations
    recomputed; 153 TFLOP/s per GPU reported. The same model as plain replicas cannot fit."""
    model = GPTConfig(vocab_size=51200, seq_len=2048, d_model=12288, n_heads=96, n_layers=96)
    cluster = plan.GPUCluster("A100-80GB", gpus_per_node=8, nodes=192)
    published = plan.project(model, Parallelism.of(dp=12, tp=8, pp=16, schedule="1f1b"), cluster,
                             global_batch=1536, micro_batches=128, precision="mixed",
                             activation_checkpointing=True)
    assert published.fits
    replicas = plan.project(model, Layout(dp=1536), cluster, global_batch=1536)
    assert not replicas.fits


def test_llama3_405b_on_h100s_fits():
    """Llama 3 paper (Dubey et al. 2024, Table 4): 405B, 126 layers, d 16384, 128 heads,
    sequence 8192, TP 8 x PP 16 x DP 128 (FSDP) on 16384 H100s, 16M tokens a batch; 400
    TFLOP/s per GPU (41% MFU) reported. Modelled as labkit's GPT (4x MLP, full attention
    heads: 406B parameters). labkit's TP has no sequence parallelism, so the planner fits it
    with activation checkpointing (the paper does not list that lever)."""
    model = GPTConfig(vocab_size=128000, seq_len=8192, d_model=16384, n_heads=128,
                      n_layers=126)
    cluster = plan.GPUCluster("H100", gpus_per_node=8, nodes=2048)
    published = plan.project(model, Parallelism.of(fsdp=128, tp=8, pp=16, schedule="1f1b"), cluster,
                             global_batch=2048, micro_batches=16, precision="mixed",
                             activation_checkpointing=True)
    assert published.fits
    one_node = plan.search(model, plan.GPUCluster("H100", nodes=1), global_batch=8)
    assert not one_node.fits


def test_mlperf_dlrm_tables_need_more_than_one_gpu():
    """MLPerf Training's DLRM on Criteo 1TB: about 100 GB of fp32 embedding tables (25B+
    parameters; Desai and Shrivastava, NeurIPS 2022), 26 tables of dimension 128, SGD; NVIDIA
    trains it table-wise over the 8 GPUs of a DGX A100. One A100-80GB cannot hold it."""
    model = DLRMConfig(num_tables=26, rows_per_table=7_500_000, embedding_dim=128,
                       bottom_hidden=512, top_hidden=1024)
    one = plan.project(model, Layout(), plan.GPUCluster("A100-80GB", gpus_per_node=1),
                       global_batch=65536, precision="fp32", optimizer="sgd")
    assert not one.fits
    eight = plan.project(model, Parallelism.of(fsdp=8, tables="table_wise"),
                         plan.GPUCluster("A100-80GB"), global_batch=65536, precision="fp32",
                         optimizer="sgd")
    assert eight.fits


@pytest.mark.parametrize("changes", [{"global_batch": 0}, {"global_batch": -8},
                                     {"micro_batches": 0}, {"optimizer": "lion"}])
def test_a_batch_or_optimizer_no_run_could_use_is_refused(changes):
    # global_batch=0 and -8 once projected negative step times; micro_batches=0 divided by 0
    kwargs = {"global_batch": 8, **changes}
    with pytest.raises(plan.PlanError, match=next(iter(changes))):
        plan.project(SMALL, Layout(dp=8), plan.GPUCluster("H100"), **kwargs)
    with pytest.raises(plan.PlanError, match="global_batch"):
        plan.search(SMALL, plan.GPUCluster("H100"), global_batch=0)


def test_decoder_optimizer_state_follows_the_optimizer():
    # labkit's mixed: fp32 weights and gradients, Adam's two fp32 moments (8 B/param); SGD none
    memory = {opt: plan.project(SMALL, Layout(dp=8), plan.GPUCluster("H100"), global_batch=8,
                                optimizer=opt).costs.memory for opt in ("adam", "sgd")}
    assert memory["sgd"]["optimizer"] == 0
    assert memory["adam"]["optimizer"] == pytest.approx(2 * memory["adam"]["parameters"])


def test_tensor_parallel_must_divide_the_node():
    # 6 GPUs per node, tp=4: ranks 4-7 form a tp group across two nodes
    six = plan.GPUCluster("H100", gpus_per_node=6, nodes=2)
    with pytest.raises(plan.PlanError, match="straddle"):
        plan.project(GPT_70B, Layout(dp=3, tp=4), six, global_batch=3)
    assert plan.project(GPT_70B, Layout(dp=6, tp=2), six, global_batch=6).links["tp"] == "in-node"
    from labkit.plan.project import spans_nodes

    assert spans_nodes(Layout(dp=4, tp=2), "dp", 6)  # a group reaches over 8 ranks: crosses
    assert spans_nodes(Layout(dp=2, tp=2), "dp", 6)  # 4 does not divide 6: ranks 4-7 cross
    assert not spans_nodes(Layout(dp=3, tp=2), "dp", 6)  # 6 ranks, one node's


def test_the_planner_refuses_the_engine_choices_a_run_refuses():
    """A projection passes the engine rules a training run passes (labkit/training/rules.py):
    ZeRO-1 replicates and cannot run over fsdp, FSDP needs fsdp > 1, tables need a DLRM."""
    with pytest.raises(ValueError, match="dp_kind='zero1' replicates the model, but fsdp=8"):
        Parallelism(Layout(fsdp=8), dp_kind="zero1")
    with pytest.raises(ValueError, match="write fsdp=8 instead of dp=8"):
        Parallelism.of(dp=8, dp_kind="fsdp")
    with pytest.raises(plan.PlanError, match="tables='row_wise'.*GPTConfig has none"):
        plan.project(GPTConfig(), Parallelism.of(fsdp=8, tables="row_wise"),
                     plan.GPUCluster("H100"), global_batch=64)
    assert Parallelism.of(fsdp=8, dp_kind="fsdp").engines.dp_kind == "fsdp"
