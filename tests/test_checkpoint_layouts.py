"""Checkpoints of every layout (labkit/training/checkpoint/state.py): pipelines, a composed dp x pp
layout, ZeRO-1 and each placement of the DLRM's embedding tables resume bit for bit after a
planted failure, and reshard to another rank count; one run at a time in a checkpoint
folder (labkit/training/checkpoint/lock.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import labkit
from labkit.models import DLRMConfig, MLPConfig
from labkit.training.checkpoint import CheckpointError
from labkit.training.checkpoint.lock import CheckpointLock
from tests.test_checkpoint import STEPS, _assert_identical, _crash, _resumed

# 4 layers with weights: 2 stages of 2 (or 4 of 1: interleaved, or dp 2 x pp 2).
MLP = MLPConfig(n_layers=4)
# 5 tables: 3 + 2 whole tables on two ranks; 64 rows split evenly by row-wise placements.
DLRM = DLRMConfig(num_tables=5, rows_per_table=64, embedding_dim=8, bottom_hidden=16,
                  top_hidden=16)


def _config(**fields) -> labkit.TrainConfig:
    tables = fields.get("strategy", "") in ("table_wise", "row_wise", "row_wise_dtensor")
    return labkit.TrainConfig(**{"model": DLRM if tables else MLP, "global_batch": 16,
                                 "steps": STEPS, "micro_batches": 1 if tables else 4,
                                 "return_weights": True, **fields})


@pytest.mark.parametrize("parallel, how", [
    ({"strategy": "1f1b"}, "kill"),
    ({"layout": labkit.Layout(dp=2, pp=2), "schedule": "gpipe"}, "raise"),
    ({"strategy": "zero1"}, "kill"),
    ({"strategy": "table_wise"}, "kill"),
    ({"strategy": "row_wise"}, "raise"),
    ({"strategy": "row_wise_dtensor"}, "raise")],
    ids=["1f1b-sigkill", "dp2-pp2-exception", "zero1-sigkill", "table_wise-sigkill",
         "row_wise-exception", "row_wise_dtensor-exception"])
def test_every_layout_resumes_bit_for_bit(request, tmp_path, parallel, how):
    world = parallel["layout"].size if "layout" in parallel else 2
    cluster = request.getfixturevalue("two" if world == 2 else "four")
    reference = labkit.train(cluster, _config(**parallel), estimate=False)
    config = _config(**parallel, checkpoint_dir=tmp_path, checkpoint_every=2)
    _crash(cluster, config, fail_rank=world - 1, fail_step=3, how=how)
    report = labkit.train(cluster, config, estimate=False)
    _resumed(report, 2)
    _assert_identical(reference, report)


# Saved on one rank count, resumed on another: every key is the whole model's name, so DCP
# reshards (stages to one device, ZeRO-1's owned states to new owners, tables re-placed).
@pytest.mark.parametrize("saved, resumed, n_saved, n_resumed", [
    ({"strategy": "interleaved_1f1b"}, {"strategy": "single"}, 2, 1),
    ({"layout": labkit.Layout(dp=2, pp=2), "schedule": "1f1b"}, {"strategy": "1f1b"}, 4, 2),
    # 2 parameter tensors on 4 ranks: ranks 2 and 3 own no optimizer state
    ({"strategy": "zero1", "model": MLPConfig(n_layers=1)},
     {"strategy": "zero1", "model": MLPConfig(n_layers=1)}, 4, 2),
    ({"strategy": "zero1"}, {"strategy": "zero1"}, 1, 2),
    ({"strategy": "table_wise"}, {"strategy": "row_wise"}, 2, 1)],
    ids=["interleaved2-to-single", "dp2-pp2-to-pp2", "zero1-4-owners-of-2-to-2", "zero1-1-to-2",
         "table_wise2-to-row_wise1"])
def test_every_layout_reshards_to_another_rank_count(request, tmp_path, saved, resumed,
                                                      n_saved, n_resumed):
    names = {1: "one", 2: "two", 4: "four"}
    first, second = (request.getfixturevalue(names[n]) for n in (n_saved, n_resumed))
    reference = labkit.train(first, _config(**saved), estimate=False)
    labkit.train(first, _config(**saved, steps=2, checkpoint_dir=tmp_path), estimate=False)
    report = labkit.train(second, _config(**resumed, checkpoint_dir=tmp_path), estimate=False)
    _resumed(report, 2)
    assert report.losses[:2] == reference.losses[:2]
    # Another split of the batch rounds differently (~1e-7); the run goes on from there.
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    for name, tensor in reference.ranks[0]["weights"].items():
        torch.testing.assert_close(report.ranks[0]["weights"][name], tensor, rtol=1e-4,
                                   atol=1e-6)


def test_a_folder_in_use_is_refused_before_any_rank_starts(two, tmp_path, monkeypatch):
    config = _config(strategy="1f1b", steps=2, checkpoint_dir=tmp_path)
    with CheckpointLock(tmp_path):  # another run holds it (here: this process)
        with pytest.raises(CheckpointError, match=f"in use by another run \\(pid "
                                                  f"{os.getpid()} on "):
            labkit.train(two, config, estimate=False)
    assert [p.name for p in tmp_path.iterdir()] == ["LOCK"]  # no rank trained or saved
    original = two.run

    def run(*args, **kwargs):  # while the ranks train, the folder is held
        with pytest.raises(CheckpointError, match="in use by another run"):
            CheckpointLock(tmp_path).take()
        return original(*args, **kwargs)

    monkeypatch.setattr(two, "run", run)
    labkit.train(two, config, estimate=False)
    monkeypatch.undo()
    CheckpointLock(tmp_path).take().release()  # let go once the run ended
    # labkit's first checkpoints nested the optimizer state: refused, not started over.
    marker = tmp_path / "step-00000002" / "COMPLETE.json"
    saved = json.loads(marker.read_text())
    del saved["format"]
    marker.write_text(json.dumps(saved))
    with pytest.raises(CheckpointError, match="older labkit .*format 1"):
        labkit.train(two, config, estimate=False)


def test_a_stale_lock_of_a_dead_run_is_taken_over(two, tmp_path):
    """A run SIGKILLed while it held the folder leaves its LOCK file, but no lock (a bare
    Python process does what ``CheckpointLock.take`` does, without importing torch)."""
    code = ("import fcntl, json, os, signal, sys\n"
            "f = open(os.path.join(sys.argv[1], 'LOCK'), 'a+')\n"
            "fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)\n"
            "json.dump({'pid': os.getpid(), 'host': 'here', 'since': 'then'}, f); f.flush()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n")
    dead = subprocess.run([sys.executable, "-c", code, str(tmp_path)], timeout=60)
    assert dead.returncode == -9
    assert json.loads((tmp_path / "LOCK").read_text())["pid"] != os.getpid()
    report = labkit.train(two, _config(strategy="zero1", steps=2, checkpoint_dir=tmp_path),
                          estimate=False)
    assert report.steps == 2
    assert json.loads((tmp_path / "LOCK").read_text())["pid"] == os.getpid()


def test_a_folder_that_cannot_be_made_is_a_checkpoint_error():
    """/proc refuses a new folder to everyone (root too, whom os.access lets through)."""
    with pytest.raises(CheckpointError, match="cannot be made or written to"):
        CheckpointLock("/proc/labkit-checkpoints").take()


@pytest.mark.parametrize("saved, resumed", [
    ({"strategy": "zero1"}, {"layout": labkit.Layout(dp=2), "dp_kind": "zero1"}),
    ({"layout": labkit.Layout(pp=2), "schedule": "gpipe"}, {"strategy": "gpipe"}),
    ({"strategy": "naive_dp"}, {"layout": labkit.Layout(dp=2), "dp_kind": "naive"})],
    ids=["zero1-to-layout", "layout-to-gpipe", "naive_dp-to-layout"])
def test_a_strategy_and_its_layout_resume_each_other(two, tmp_path, saved, resumed):
    """A strategy name and the layout + engine choices it stands for are one run: a
    checkpoint of one resumes the other bit for bit; another run's is still refused."""
    reference = labkit.train(two, _config(**saved), estimate=False)
    labkit.train(two, _config(**saved, steps=2, checkpoint_dir=tmp_path), estimate=False)
    report = labkit.train(two, _config(**resumed, checkpoint_dir=tmp_path), estimate=False)
    _resumed(report, 2)
    _assert_identical(reference, report)
    other = _config(**resumed, checkpoint_dir=tmp_path, lr=1e-2)  # same layout, other run
    with pytest.raises(CheckpointError, match="another run.*lr=0.001 there, 0.01 here"):
        labkit.train(two, other, estimate=False)
