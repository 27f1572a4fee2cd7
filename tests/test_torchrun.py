"""Every kind of strategy under torchrun (several in one launch, to start torch once), and a
checkpointed run under torchrun resumed by a second launch."""

from __future__ import annotations

import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import labkit

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))
# One of each code path on 2 ranks: DDP, ZeRO-1's optimizer, FSDP2, DTensor TP, a pipeline.
STRATEGIES = ["ddp", "zero1", "fsdp", "tp", "gpipe"]


def _torchrun(cwd: Path, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", "2", "-m", "labkit", "train",
         "--model", "mlp", "--global-batch", "16", *args], cwd=cwd, capture_output=True,
        text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_every_kind_of_strategy_runs_under_torchrun(tmp_path):
    _torchrun(tmp_path, "--strategy", *STRATEGIES, "--steps", "2", "--micro-batches", "2",
              "--out", str(tmp_path / "run.json"))
    first = {}
    for strategy in STRATEGIES:
        report = labkit.TrainReport.load(tmp_path / f"run.{strategy}.json")
        assert report.config.strategy == strategy and report.world_size == 2
        assert "torchrun" in report.where and report.estimate["peak_bytes"] > 0
        assert report.steps == 2 and all(math.isfinite(loss) for loss in report.losses)
        first[strategy] = report.losses[0]
    # One seed, the same initial weights and batch: the first loss agrees across layouts.
    assert max(first.values()) - min(first.values()) < 1e-5, first


def test_a_torchrun_run_resumes_from_its_checkpoint(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    common = ("--strategy", "fsdp", "--checkpoint-dir", ckpt, "--checkpoint-every", "1")
    _torchrun(tmp_path, *common, "--steps", "2", "--out", str(tmp_path / "a.json"))
    _torchrun(tmp_path, *common, "--steps", "3", "--out", str(tmp_path / "b.json"))
    first = labkit.TrainReport.load(tmp_path / "a.json")
    resumed = labkit.TrainReport.load(tmp_path / "b.json")
    assert resumed.ranks[0]["resumed_at"] == 2 and resumed.steps == 3
    assert resumed.losses[:2] == first.losses
    assert [r.get("from_checkpoint", False) for r in resumed.ranks[0]["records"]] == [
        True, True, False]
    assert sorted(p.name for p in Path(ckpt).iterdir()) == [
        "step-00000001", "step-00000002", "step-00000003"]


def test_every_training_option_reaches_the_config_from_the_command_line():
    """Each TrainConfig option torchrun offers lands in the run's config (read without
    starting torchrun: the parser and the configs it makes)."""
    import argparse

    from labkit.train.torchrun import _configs, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([
        "--model", "gpt", "--layout", "fsdp=2,tp=2", "--global-batch", "32", "--steps", "3",
        "--precision", "mixed", "--micro-batches", "1", "--grad-accumulation", "2",
        "--activation-checkpointing", "--checkpoint-dir", "ckpt", "--checkpoint-every", "2"])
    [(config, out)] = _configs(args)
    assert (config.layout, config.global_batch, config.steps) == (
        labkit.Layout(fsdp=2, tp=2), 32, 3)
    assert (config.precision, config.grad_accumulation, config.activation_checkpointing) == (
        "mixed", 2, True)
    assert (config.checkpoint_dir, config.checkpoint_every, out) == ("ckpt", 2, "report.json")
