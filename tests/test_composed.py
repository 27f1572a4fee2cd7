"""Parallelisms composed on one mesh, by feature combination (as torchtitan's integration
tests list flag combinations): each run trains exactly as one device (losses, and with SGD
every weight), holds on each rank what the estimator traced for that rank (within 10%), and
files its communication under the mesh dimensions it uses.

CPU ranks over gloo, oversubscribed on a 2-core machine: correctness, not speed."""

from __future__ import annotations

import pytest
import torch

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig
from labkit.parallel.embedding import merged_weights
from labkit.training.layout import Layout

MLP = MLPConfig(d_in=32, d_hidden=128, n_layers=4, d_out=8)
# 3 linears in 2 stages: the cut falls inside a tensor-parallel pair (column-wise, then
# row-wise), so a tp rank's local shard (batch, d_hidden / tp) crosses to the next stage
MLP_ODD_CUT = MLPConfig(d_in=32, d_hidden=128, n_layers=3, d_out=8)
GPT = GPTConfig(vocab_size=128, seq_len=16, d_model=64, n_heads=4, n_layers=2)
# Llama-style blocks at toy size: SwiGLU, grouped-query attention (2 key/value heads for 4
# query heads), RMSNorm, rotary positions, no biases; tied embeddings where no pipeline cuts
# the embedding from the head
LLAMA = GPTConfig(vocab_size=128, seq_len=16, d_model=64, n_heads=4, n_layers=2, mlp="swiglu",
                  d_ff=96, n_kv_heads=2, norm="rmsnorm", position="rope", bias=False)
LLAMA_TIED = GPTConfig(**{**LLAMA.__dict__, "tie_embeddings": True})
DLRM = DLRMConfig(num_tables=4, rows_per_table=256, embedding_dim=8, bottom_hidden=16,
                  top_hidden=16)
FSDP = {"all_gather", "reduce_scatter"}

# id: (model, layout and engine choices, micro-batches, {dimension: the collectives it carries})
COMBINATIONS = {
    "fsdp2_tp2_gpt": (GPT, dict(layout=Layout(fsdp=2, tp=2)), 1,
                      {"fsdp": FSDP, "tp": {"all_reduce"}}),
    "fsdp2_tp2_llama": (LLAMA_TIED, dict(layout=Layout(fsdp=2, tp=2)), 1,
                        {"fsdp": FSDP, "tp": {"all_reduce"}}),
    "fsdp2_tp2_mlp": (MLP, dict(layout=Layout(fsdp=2, tp=2)), 1,
                      {"fsdp": FSDP, "tp": {"all_reduce"}}),
    "hsdp_dp2_fsdp2": (MLP, dict(layout=Layout(dp=2, fsdp=2)), 1,
                       {"fsdp": FSDP, "dp": {"all_reduce"}}),
    "dp2_tp2": (MLP, dict(layout=Layout(dp=2, tp=2)), 1,
                {"dp": {"all_reduce"}, "tp": {"all_reduce"}}),
    "dp2_pp2_gpipe": (MLP, dict(layout=Layout(dp=2, pp=2), schedule="gpipe"), 2,
                      {"pp": {"send", "recv"}, "dp": {"all_reduce"}}),
    "dp2_pp2_1f1b": (MLP, dict(layout=Layout(dp=2, pp=2), schedule="1f1b"), 2,
                     {"pp": {"send", "recv"}, "dp": {"all_reduce"}}),
    # (rank 0's stage is one column-wise linear: its tp pair never communicates)
    "tp2_pp2_cut_inside_a_tp_pair": (MLP_ODD_CUT, dict(layout=Layout(tp=2, pp=2)), 2,
                                     {"pp": {"send", "recv"}}),
    "naive_dp2_tp2": (MLP, dict(layout=Layout(dp=2, tp=2), dp_kind="naive"), 1,
                      {"dp": {"all_reduce"}, "tp": {"all_reduce"}}),
    "naive_dp2_pp2": (MLP, dict(layout=Layout(dp=2, pp=2), dp_kind="naive", schedule="gpipe"), 2,
                      {"pp": {"send", "recv"}, "dp": {"all_reduce"}}),
    # the hand-written schedules over FSDP2's replicate (reduced at the last micro-batch)
    # and beside the hand-written AllReduce
    "dp2_pp2_naive_1f1b": (MLP, dict(layout=Layout(dp=2, pp=2), schedule="naive_1f1b"), 2,
                           {"pp": {"send", "recv"}, "dp": {"all_reduce"}}),
    "naive_dp2_pp2_naive_gpipe": (MLP, dict(layout=Layout(dp=2, pp=2), dp_kind="naive",
                                            schedule="naive_gpipe"), 2,
                                  {"pp": {"send", "recv"}, "dp": {"all_reduce"}}),
    "tables_dp2_fsdp2": (DLRM, dict(layout=Layout(dp=2, fsdp=2), tables="table_wise"), 1,
                         {"fsdp": {"all_gather", "all_to_all", "all_reduce"},
                          "dp": {"all_reduce"}}),
}


@pytest.fixture(scope="module")
def references(one):
    """One device, SGD: the losses and weights every layout must reproduce."""
    runs = {}

    def reference(model, micro_batches: int = 1):
        key = (model, micro_batches)
        if key not in runs:
            runs[key] = labkit.train(one, _config(model, micro_batches), estimate=False)
        return runs[key]

    return reference


def _config(model, micro_batches: int = 1, **fields) -> labkit.TrainConfig:
    return labkit.TrainConfig(model=model, global_batch=16, steps=3, lr=0.1, optimizer="sgd",
                              micro_batches=micro_batches, return_weights=True, **fields)


def _check(report, reference, dims: dict[str, set[str]]) -> None:
    # The same training: losses step by step, and every weight every rank holds.
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    want = reference.ranks[0]["weights"]
    merged = merged_weights(report)
    assert sorted(merged) == sorted(want)
    for rank in report.ranks:
        for name, value in rank["weights"].items():
            torch.testing.assert_close(value, want[name], rtol=1e-5, atol=1e-6)
    # Memory per rank as traced for that rank, and the estimate as the highest of them.
    assert report.estimate_error() < 0.10, (report.peak_bytes, report.estimate)
    for rank, estimated in report.estimate["per_rank"].items():
        measured = report.ranks[int(rank)]["memory"]["peak_bytes"]
        assert abs(estimated - measured) < 0.10 * measured, (rank, estimated, measured)
    # Communication by mesh dimension: each dimension carries its own collectives.
    by_dim = report.comm_by_dim()
    for dim, kinds in dims.items():
        assert kinds <= set(by_dim.get(dim, {})), (dim, by_dim)
    assert set(by_dim) <= set(dims), by_dim
    record = report.records(0)[-1]
    assert record.comm_bytes == sum(s.bytes for s in record.comm) > 0
    assert record.compute_s + record.comm_s == pytest.approx(record.step_s)


@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_composed_layout_trains_as_one_device(four, references, name):
    model, parallel, micro_batches, dims = COMBINATIONS[name]
    report = labkit.train(four, _config(model, micro_batches, **parallel))
    assert report.layout == parallel["layout"] and report.world_size == 4
    _check(report, references(model, micro_batches), dims)


# id: (model, layout and engine choices, micro-batches, {dimension: its collectives}), 2 ranks
LLAMA_LAYOUTS = {
    "ddp2": (LLAMA_TIED, dict(layout=Layout(dp=2), dp_kind="ddp"), 1, {"dp": {"all_reduce"}}),
    "fsdp2": (LLAMA_TIED, dict(layout=Layout(fsdp=2)), 1, {"fsdp": FSDP}),
    "tp2": (LLAMA_TIED, dict(layout=Layout(tp=2)), 1, {"tp": {"all_reduce"}}),
    "pp2_1f1b": (LLAMA, dict(layout=Layout(pp=2), schedule="1f1b"), 2,
                 {"pp": {"send", "recv"}}),
}


@pytest.mark.parametrize("name", list(LLAMA_LAYOUTS))
def test_llama_blocks_train_as_one_device(two, references, name):
    model, parallel, micro_batches, dims = LLAMA_LAYOUTS[name]
    report = labkit.train(two, _config(model, micro_batches, **parallel))
    _check(report, references(model, micro_batches), dims)


def test_pipeline_tensor_and_data_parallel_in_3d_on_eight_ranks(references):
    """pp 2 x dp 2 x tp 2: Megatron's 3D layout, at the smallest size that has all three."""
    layout = Layout(pp=2, dp=2, tp=2)
    with labkit.Cluster(8, device="cpu", progress=False) as eight:
        report = labkit.train(eight, _config(MLP, 2, layout=layout, schedule="1f1b"),
                              timeout=600)
    _check(report, references(MLP, 2),
           {"pp": {"send", "recv"}, "dp": {"all_reduce"}, "tp": {"all_reduce"}})
    # Each tp pair splits its stage's weights: about half a stage's parameters per rank.
    stage_params = [r["memory"]["at_peak"]["parameters"] for r in report.ranks]
    assert max(stage_params) < 0.6 * references(MLP, 2).ranks[0]["memory"]["at_peak"][
        "parameters"]


def test_the_hybrid_recommender_splits_tables_within_groups_only(four):
    """Tables placed table-wise inside each group of 2 ranks, the same placement in both
    groups (replicas): each rank holds about half the tables, as in a 2-rank table-wise run,
    and the replicas' tables agree."""
    report = labkit.train(four, _config(DLRM, layout=Layout(dp=2, fsdp=2),
                                        tables="table_wise"),
                          estimate=False)
    plans = [r["records"][0]["plan"]["tables_per_rank"] for r in report.ranks]
    assert all(plan == plans[0] for plan in plans) and len(plans[0]) == 2
    held = [sorted(k for k in r["weights"] if k.startswith("tables.")) for r in report.ranks]
    assert held[0] == held[2] and held[1] == held[3] and held[0] != held[1]
