"""Data parallelism: naive and DDP equal single-device training; reports add up; torchrun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig
from tests.conftest import descendants

REPO = Path(__file__).resolve().parent.parent


def _assert_same_training(reference, report, tol=1e-5):
    """Losses step by step, and final weights on every rank. SGD is used for weights: its
    update is linear in the gradient, while Adam divides by sqrt(v) and so blows float
    rounding of near-zero gradients up to full-size steps."""
    for step, (a, b) in enumerate(zip(reference.losses, report.losses, strict=True)):
        assert abs(a - b) <= tol * max(1.0, abs(a)), f"step {step}: {a} vs {b}"
    ref_weights = reference.ranks[0]["weights"]
    for rank in report.ranks:
        for name, tensor in rank["weights"].items():
            torch.testing.assert_close(tensor, ref_weights[name], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("model", [MLPConfig(), GPTConfig(), DLRMConfig()], ids=lambda m: m.name)
@pytest.mark.parametrize("strategy", ["naive_dp", "ddp"])
def test_data_parallel_equals_one_device_step_by_step(one, two, model, strategy):
    config = labkit.TrainConfig(model=model, global_batch=16, steps=4, lr=0.05,
                                optimizer="sgd", return_weights=True)
    reference = labkit.train(one, config, estimate=False)
    report = labkit.train(two, config, strategy=strategy, estimate=False)
    _assert_same_training(reference, report)
    adam = config.replace(optimizer="adam", lr=1e-3, return_weights=False)
    assert labkit.train(two, adam, strategy=strategy, estimate=False).losses == pytest.approx(
        labkit.train(one, adam, estimate=False).losses, rel=1e-5)


def test_ddp_on_four_ranks_and_with_accumulation_equals_one_device(one):
    config = labkit.TrainConfig(model=MLPConfig(), global_batch=32, steps=3, lr=0.05,
                                optimizer="sgd", return_weights=True)
    reference = labkit.train(one, config, estimate=False)
    with labkit.Cluster(4, device="cpu", progress=False) as four:
        _assert_same_training(reference, labkit.train(four, config, strategy="ddp",
                                                      micro_batches=2, estimate=False))
    _assert_same_training(reference, labkit.train(one, config, micro_batches=4, estimate=False))


@pytest.mark.parametrize("strategy", ["naive_dp", "ddp"])
def test_report_is_complete_and_adds_up(two, strategy, tmp_path):
    report = labkit.train(two, model=MLPConfig(), strategy=strategy, global_batch=32, steps=4)
    n_params = sum(p.numel() for p in labkit.models.build_model(MLPConfig()).parameters())
    for rank in report.ranks:
        for record in rank["records"]:
            assert record["compute_s"] + record["comm_s"] == pytest.approx(record["step_s"])
            assert record["comm_busy_s"] > 0 and record["comm_s"] >= 0
            assert record["comm_bytes"] == 4 * n_params  # every gradient, once per step
    split = report.split()
    assert split["compute_s"] + split["comm_s"] == pytest.approx(split["step_s"])
    assert report.samples_per_s == pytest.approx(32 / report.median_step_s)
    assert report.oversubscribed is False and report.world_size == 2
    loaded = labkit.TrainReport.load(report.save(tmp_path / "report.json"))
    assert loaded.losses == report.losses and loaded.split() == split
    assert loaded.config == report.config


def test_bad_configs_fail_before_any_run(two):
    before = descendants()
    with pytest.raises(ValueError, match="split evenly"):
        labkit.train(two, model="mlp", strategy="ddp", global_batch=15)
    with pytest.raises(ValueError, match="unknown strategy"):
        labkit.train(two, model="mlp", strategy="magic")
    with pytest.raises(ValueError, match="one device"):
        labkit.train(two, model="mlp", strategy="single")
    assert descendants() == before


def test_torchrun_writes_the_same_report(two, tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    out = tmp_path / "report.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [torchrun, "--standalone", "--nproc-per-node", "2", "-m", "labkit", "train",
         "--model", "mlp", "--strategy", "ddp", "--global-batch", "32", "--steps", "3",
         "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=180, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    report = labkit.TrainReport.load(out)
    assert report.world_size == 2 and "torchrun" in report.where
    here = labkit.train(two, report.config, estimate=False)
    assert report.losses == pytest.approx(here.losses, rel=1e-6)
    assert labkit.plots.plot_losses({"torchrun": report, "notebook": here}).axes


def test_scaling_sweep_and_the_ring_model(one):
    assert labkit.ring_all_reduce_seconds(1e9, 4, 1e9) == pytest.approx(1.5)
    assert labkit.ring_all_reduce_seconds(1e9, 1, 1e9) == 0
    strong = labkit.scaling_sweep(one, "mlp", 2e5, (1, 2), global_batch=32, steps=3)
    assert one.world_size == 1
    assert strong.speedup(1) == 1 and strong.speedup(2) > 0
    assert strong.bus_bandwidth > 0 and strong.point(2).predicted_comm_s > 0
    weak = labkit.scaling_sweep(one, "mlp", 2e5, (1, 2), global_batch=16, mode="weak", steps=3)
    assert [p.global_batch for p in weak.points] == [16, 32]
    assert labkit.plots.plot_speedup(weak).axes and labkit.plots.plot_step_breakdown(strong).axes
    with pytest.raises(ValueError, match="world size 1"):
        labkit.scaling_sweep(one, "mlp", 2e5, (2, 4))


def test_batch_sweep_reuses_runs_and_predicts_the_step(one, two):
    """The walk into the communication wall: each batch on one device and on N, runs already
    made taken as they are, the model's step F/N + O + AllReduce beside the measurement."""
    config = labkit.TrainConfig(model=MLPConfig(), global_batch=32, steps=3)
    ddp = labkit.train(two, config, strategy="ddp", estimate=False)
    walk = labkit.batch_sweep(two, config, [32, 8], measured=[ddp])
    assert two.world_size == 2 and walk.reports[0] is ddp  # reused, not trained again
    big, small = walk.point(32), walk.point(8)
    assert big.many.step_s == ddp.median_step_s and small.samples_per_rank == 4
    assert big.many.predicted_comm_s == 0  # no comm_model given: no prediction
    step = (big.one.step_s - big.optimizer_s) / 2 + big.optimizer_s
    assert big.predicted_step_s == pytest.approx(step)
    assert walk.strong(8).speedup(2) == pytest.approx(small.speedup)
    weak = labkit.scaling_sweep(two, config.model, world_sizes=(1, 2), global_batch=8,
                                mode="weak", steps=3, measured=walk.reports)
    assert weak.point(1).step_s == small.one.step_s  # the walk's one-device run at 8
    assert labkit.plots.plot_batch_sweep(walk).axes
    assert labkit.plots.plot_speedup([walk.strong(8), weak]).axes
    with pytest.raises(ValueError, match="do not split"):
        labkit.batch_sweep(two, config, [9])
    with pytest.raises(ValueError, match="2 ranks or more"):
        labkit.batch_sweep(one, config, [8])


def test_scaling_explorer_redraws_when_the_gpu_count_moves():
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        box = labkit.widgets.scaling_explorer(cluster, "mlp", (2e5,), (1, 2), world_size=1,
                                              global_batch=16, steps=2)
        before = box.plot.outputs[0]["data"]["image/png"]
        box.gpus.value = 2
        box.runner.wait(timeout=60)
        assert cluster.world_size == 1  # measured on 2 ranks, then back to the count it had
        assert box.plot.outputs[0]["data"]["image/png"] != before
        assert box.batch.disabled  # one batch offered: nothing to move


def test_scaling_explorer_offers_batches_and_shows_runs_already_made(one):
    config = labkit.TrainConfig(model=labkit.models.sized("mlp", 2e5), global_batch=16, steps=2)
    known = labkit.train(one, config, estimate=False)
    explorer = labkit.widgets.ScalingExplorer(one, "mlp", (2e5,), (1, 2), global_batch=16,
                                              batches=(16, 32), steps=2, measured=[known])
    params = explorer.sizes[0]
    assert explorer.point(params, 1, 16).step_s == known.median_step_s  # shown, not retrained
    assert explorer.point(params, 2, 32).global_batch == 32 and one.world_size == 1
    assert explorer.result(params, 2, 32).speedup(2) > 0


def test_every_training_option_reaches_the_config_from_torchrun_s_command_line():
    """Each TrainConfig option ``python -m labkit train`` offers lands in the run's config
    (read without starting torchrun: the parser and the config it makes)."""
    import argparse

    from labkit.training.torchrun import _configs, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    [(config, _)] = _configs(parser.parse_args([
        "--model", "gpt", "--layout", "fsdp=2,tp=2", "--global-batch", "32", "--steps", "3",
        "--lr", "0.01", "--optimizer", "sgd", "--precision", "mixed", "--micro-batches", "1",
        "--grad-accumulation", "2", "--activation-checkpointing"]))
    assert (config.layout, config.global_batch, config.steps, config.lr, config.optimizer) == (
        labkit.Layout(fsdp=2, tp=2), 32, 3, 0.01, "sgd")
    assert (config.precision, config.grad_accumulation, config.activation_checkpointing) == (
        "mixed", 2, True)
    with pytest.raises(ValueError, match="gives dp twice"):
        _configs(parser.parse_args(["--layout", "dp=2,dp=3"]))


def test_a_run_survives_its_estimate_failing(one, monkeypatch):
    """The estimate is traced after the run: if the tracer fails, the run's results stand."""
    def broken(run):
        raise RuntimeError("tracer broke")

    import importlib

    monkeypatch.setattr(importlib.import_module("labkit.training.api"), "estimate_memory", broken)
    with pytest.warns(RuntimeWarning, match="estimate failed .*tracer broke"):
        report = labkit.train(one, model="mlp", global_batch=8, steps=2)
    assert len(report.losses) == 2 and report.estimate is None


def test_the_ceiling_is_measured_on_every_rank_against_one_alone():
    from labkit.lessons.data_parallel.capacity import parallel_capacity

    with labkit.Cluster(1, progress=False) as one, labkit.Cluster(2, progress=False) as two:
        with pytest.raises(ValueError, match="1 rank"):
            parallel_capacity(two, one)
        capacity = parallel_capacity(one, two)
    assert capacity.world_size == 2 and capacity.products > 0
    assert capacity.alone_s > 0 and capacity.together_s > 0
    assert capacity.speedup == pytest.approx(2 * capacity.alone_s / capacity.together_s)
    assert "2 ranks at once do" in str(capacity)


def test_the_hand_written_averaging_shown_is_the_algorithm_alone():
    """Notebook 02 shows average_gradients: plain tensors, no DTensor handling (training
    hands it a tensor-parallel model's local shards: ``LocalShards``)."""
    import inspect

    from labkit.parallel.data import naive

    for function in (naive.average_gradients, naive.broadcast_parameters):
        source = inspect.getsource(function)
        assert "DTensor" not in source and "_local" not in source and "to_local" not in source
