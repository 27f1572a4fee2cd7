"""ZeRO-1 and FSDP2: same training as one device, memory per rank as estimated, traffic as
the algorithms say."""

from __future__ import annotations

import pytest
import torch

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig, count_parameters
from labkit.parallel.sharded import zero1_partition
from labkit.training import TrainConfig
from labkit.training.estimate import estimate_memory

ZOO = [MLPConfig(), GPTConfig(), DLRMConfig()]


@pytest.fixture(scope="module")
def references(one):
    """Single-device runs to compare with: losses and final weights (SGD, see test_ddp)."""
    return {m.name: labkit.train(one, model=m, global_batch=16, steps=3, optimizer="sgd",
                                 return_weights=True) for m in ZOO}


def _weight_gap(report, reference) -> float:
    want = reference.ranks[0]["weights"]
    return max((rank["weights"][k] - want[k]).abs().max().item()
               for rank in report.ranks for k in want)


@pytest.mark.parametrize("model", ZOO, ids=lambda m: m.name)
@pytest.mark.parametrize("strategy", ["zero1", "fsdp"])
def test_sharded_training_equals_one_device(two, references, model, strategy):
    report = labkit.train(two, model=model, strategy=strategy, global_batch=16, steps=3,
                          optimizer="sgd", return_weights=True)
    reference = references[model.name]
    assert report.losses == pytest.approx(reference.losses, abs=1e-5)
    assert _weight_gap(report, reference) < 1e-6


def test_fsdp_with_adam_and_micro_batches_equals_ddp(two):
    runs = {s: labkit.train(two, model=MLPConfig(), strategy=s, global_batch=32, steps=4,
                            micro_batches=2) for s in ("ddp", "fsdp", "zero1")}
    assert runs["fsdp"].losses == pytest.approx(runs["ddp"].losses, abs=1e-5)
    assert runs["zero1"].losses == pytest.approx(runs["ddp"].losses, abs=1e-5)


def _state_bytes(config) -> int:
    return count_parameters(config.model) * 4


def test_traffic_is_what_each_algorithm_sends(two):
    """DDP AllReduces every gradient once; ZeRO-1 also broadcasts every parameter once;
    FSDP2 reduce-scatters every gradient and all-gathers parameters for forward and again
    for backward (the root's stay gathered between the two)."""
    config = TrainConfig(model=GPTConfig(), global_batch=16, steps=2)
    size = _state_bytes(config)
    kinds = {}
    for strategy in ("ddp", "zero1", "fsdp"):
        report = labkit.train(two, config.replace(strategy=strategy))
        kinds[strategy] = report.ranks[0]["records"][-1]
        assert report.ranks[1]["records"][-1]["comm_bytes"] == kinds[strategy]["comm_bytes"]
    assert kinds["ddp"]["comm_bytes"] == size
    zero = kinds["zero1"]["comm_kinds"]
    assert zero["all_reduce"][1] == size
    assert size <= zero["broadcast"][1] < 1.001 * size  # (plus a few bytes of bookkeeping)
    fsdp = kinds["fsdp"]["comm_kinds"]
    assert set(fsdp) == {"all_gather", "reduce_scatter"}
    assert fsdp["reduce_scatter"][1] == size
    assert size < fsdp["all_gather"][1] <= 2 * size
    blocks = config.model.n_layers
    assert fsdp["reduce_scatter"][0] == blocks + 1  # one per unit: each block, and the root
    assert fsdp["all_gather"][0] == 2 * blocks + 1
    for record in kinds.values():
        assert record["comm_busy_s"] > 0 and 0 <= record["comm_s"] <= record["step_s"]


def test_memory_per_rank_falls_with_world_size_as_estimated(two):
    """Peak per rank at 1 and 2 ranks (the cluster is resized), each within 10% of the
    estimate traced on a fake process group; FSDP's falls further than ZeRO-1's."""
    config = TrainConfig(model=MLPConfig(d_hidden=512), global_batch=16, steps=3)
    peaks = {}
    try:
        for world_size in (1, 2):
            two.resize(world_size)
            for strategy in ("ddp", "zero1", "fsdp"):
                report = labkit.train(two, config.replace(strategy=strategy))
                assert report.estimate_error() < 0.10, (strategy, world_size)
                peaks[strategy, world_size] = max(report.peak_bytes)
    finally:
        two.resize(2)
    # a full copy per rank (only the activations of the halved batch slice shrink)
    assert peaks["ddp", 2] == pytest.approx(peaks["ddp", 1], rel=0.01)
    assert peaks["zero1", 2] < peaks["zero1", 1]
    assert peaks["fsdp", 2] < peaks["zero1", 2] < peaks["ddp", 2]


def test_estimated_optimizer_state_follows_the_zero_formula():
    """Adam's two moments per rank: the whole 8 bytes/parameter on one rank, 1/N of it under
    FSDP (padded to whole rows), about 1/N under ZeRO-1 (whole tensors per rank)."""
    config = TrainConfig(model=GPTConfig(), strategy="fsdp", global_batch=16)
    adam = 2 * count_parameters(config.model) * 4
    params = []
    for world_size in (1, 2, 4):
        at_peak = estimate_memory(config, world_size).at_peak
        assert adam / world_size <= at_peak["optimizer"] <= 1.05 * adam / world_size
        params.append(at_peak["parameters"])
    assert params == sorted(params, reverse=True)
    zero = estimate_memory(config.replace(strategy="zero1"), 2).at_peak["optimizer"]
    assert adam / 2 <= zero <= 0.7 * adam


def test_zero1_partition_is_the_optimizers_rule():
    assert zero1_partition([10, 40, 30, 20], 2) == [[1, 0], [2, 3]]
    owned = zero1_partition([5] * 8, 4)
    assert sorted(len(o) for o in owned) == [2, 2, 2, 2]


def test_fsdp_trains_a_model_that_ddp_cannot_fit(two):
    config = TrainConfig(model=MLPConfig(d_hidden=768), strategy="ddp", global_batch=16,
                         steps=2)
    ddp = estimate_memory(config, 2).peak_bytes
    fsdp = estimate_memory(config.replace(strategy="fsdp"), 2).peak_bytes
    capacity = (ddp + fsdp) // 2
    with pytest.raises(labkit.DeviceOOM):
        labkit.train(two, config, memory_per_device=capacity)
    report = labkit.train(two, config.replace(strategy="fsdp"), memory_per_device=capacity)
    assert max(report.peak_bytes) <= capacity
    assert torch.isfinite(torch.tensor(report.losses)).all()


def test_comparison_plots_and_explorer_reuse_measured_runs(two):
    from matplotlib.figure import Figure

    config = TrainConfig(model=MLPConfig(), global_batch=16, steps=2)
    comparison = labkit.compare_sharding(two, config, world_sizes=(1, 2))
    assert two.world_size == 2  # put back after resizing
    assert [(r.strategy, r.world_size) for r in comparison.rows] == [
        (s, n) for n in (1, 2) for s in ("ddp", "zero1", "fsdp")]
    assert all(gap < 1e-5 for gap in comparison.loss_gaps(2).values())
    for fig in (labkit.plots.plot_sharded_memory(comparison, 4_000_000),
                labkit.plots.plot_comm_price(comparison),
                labkit.plots.plot_zero_stages(7.5e9, 64)):
        assert isinstance(fig, Figure)
    explorer = labkit.widgets.ShardingExplorer(two, config, (1, 2), measured=comparison)
    box = explorer.widget(2, background=False)
    box.gpus.value = 1  # cached: drawn from the runs above, nothing trained
    assert box.status.value == "" and len(box.plot.outputs) == 1
    assert explorer.comparison(1).rows == comparison.rows[:3]
    assert "fsdp" in box.message.value


def test_bad_comparisons_are_refused_before_any_run(two):
    config = TrainConfig(model=MLPConfig(), global_batch=6, steps=2)
    with pytest.raises(ValueError, match="does not split evenly"):
        labkit.compare_sharding(two, config, world_sizes=(1, 4))
    assert two.world_size == 2
