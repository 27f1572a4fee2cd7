"""Checkpoints (labkit/training/checkpoint): a run killed mid-way resumes exactly; on another rank
count it continues; damaged, partial or foreign checkpoints are passed over or refused."""

from __future__ import annotations

import json
import os
import signal
import warnings

import pytest
import torch

import labkit
from labkit.training import loop
from labkit.training.checkpoint import CheckpointError, CheckpointWarning
from labkit.training.run import resolve

STEPS = 5


def _train_until_failure(ctx, config_dict: dict, fail_rank: int, fail_step: int, how: str):
    """``train_on_rank`` with a failure planted on rank ``fail_rank`` as step ``fail_step``
    begins: an exception, or the rank SIGKILLed. The rank is replaced after the failure."""
    original = loop._one_step

    def one_step(run, config, built, observers, step, tracked):
        if step == fail_step and run.rank == fail_rank:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError("planted failure")
        return original(run, config, built, observers, step, tracked)

    loop._one_step = one_step
    try:
        return loop.train_on_rank(ctx, config_dict)
    finally:
        loop._one_step = original


def _crash(cluster, config, fail_rank: int, fail_step: int, how: str) -> None:
    with pytest.raises(labkit.RankError, match=f"rank {fail_rank}"):
        cluster.run(_train_until_failure, resolve(config, cluster.world_size).to_dict(),
                    fail_rank, fail_step, how, timeout=120)


def _config(**fields) -> labkit.TrainConfig:
    return labkit.TrainConfig(**{"model": "mlp", "global_batch": 16, "steps": STEPS,
                                 "return_weights": True, **fields})


def _assert_identical(reference, report) -> None:
    assert report.losses == reference.losses  # bit for bit
    for ref_rank, rank in zip(reference.ranks, report.ranks, strict=True):
        for name, tensor in ref_rank["weights"].items():
            assert torch.equal(rank["weights"][name], tensor), name


def _saved(folder) -> list[str]:
    """The checkpoints in ``folder`` (without the run's ``LOCK``)."""
    return sorted(p.name for p in folder.iterdir() if p.name != "LOCK")


def _resumed(report, at: int) -> None:
    assert report.steps == STEPS and report.ranks[0]["resumed_at"] == at
    for rank in report.ranks:
        marks = [r.get("from_checkpoint", False) for r in rank["records"]]
        assert marks == [True] * at + [False] * (STEPS - at)


@pytest.mark.parametrize("parallel, how", [
    ({"strategy": "ddp"}, "raise"), ({"strategy": "fsdp"}, "kill"),
    ({"strategy": "tp"}, "raise"), ({"layout": labkit.Layout(fsdp=2, tp=2)}, "raise")],
    ids=["ddp-exception", "fsdp-sigkill", "tp-exception", "fsdp2-tp2-exception"])
def test_a_killed_run_resumes_bit_for_bit(request, tmp_path, parallel, how):
    world = parallel["layout"].size if "layout" in parallel else 2
    cluster = request.getfixturevalue("two" if world == 2 else "four")
    reference = labkit.train(cluster, _config(**parallel), estimate=False)
    config = _config(**parallel, checkpoint_dir=tmp_path / "ck", checkpoint_every=2)
    _crash(cluster, config, fail_rank=1, fail_step=3, how=how)
    assert sorted(p.name for p in (tmp_path / "ck").iterdir()) == ["step-00000002"]
    report = labkit.train(cluster, config, estimate=False)
    again = labkit.train(cluster, config, estimate=False)  # finished: nothing to run
    _resumed(report, 2)
    _assert_identical(reference, report)
    saved = [r["records"][1]["checkpoint_bytes"] for r in report.ranks]
    total = sum(f.stat().st_size for f in (tmp_path / "ck/step-00000002").glob("*.distcp"))
    assert sum(saved) == total > 0
    assert all(r["records"][1]["checkpoint_s"] > 0 for r in report.ranks)
    assert again.losses == report.losses and again.ranks[0]["resumed_at"] == STEPS


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_resume_on_fewer_ranks_continues_the_run(one, two, tmp_path, strategy):
    """Saved on 2 ranks, resumed on 1 (DCP reshards). Not bit for bit: on 2 ranks the
    gradient is the mean of two half-batch gradients, on 1 the gradient of the whole batch,
    which rounds differently (about 1e-7 relative); the run continues within that."""
    reference = labkit.train(two, _config(strategy=strategy), estimate=False)
    config = _config(strategy=strategy, checkpoint_dir=tmp_path, checkpoint_every=2)
    _crash(two, config, fail_rank=0, fail_step=2, how="raise")
    report = labkit.train(one, config, estimate=False)
    _resumed(report, 2)
    assert report.losses[:2] == reference.losses[:2]  # the saved steps' whole-batch losses
    assert report.ranks[0]["records"][0]["saved_on_ranks"] == 2
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    for name, tensor in reference.ranks[0]["weights"].items():
        torch.testing.assert_close(report.ranks[0]["weights"][name], tensor, rtol=1e-4,
                                   atol=1e-6)


# Saved on 4 ranks, resumed on 2 (DCP reshards every tensor to the new layout).
@pytest.mark.parametrize("saved, resumed", [
    ({"strategy": "ddp"}, {"strategy": "ddp"}),
    ({"strategy": "fsdp"}, {"strategy": "fsdp"}),
    ({"strategy": "tp"}, {"strategy": "tp"}),
    ({"layout": labkit.Layout(fsdp=2, tp=2)}, {"layout": labkit.Layout(tp=2)})],
    ids=["ddp", "fsdp", "tp", "fsdp2-tp2-to-tp2"])
def test_saved_on_four_ranks_resumes_on_two(four, two, tmp_path, saved, resumed):
    reference = labkit.train(four, _config(**saved), estimate=False)
    labkit.train(four, _config(**saved, steps=2, checkpoint_dir=tmp_path), estimate=False)
    report = labkit.train(two, _config(**resumed, checkpoint_dir=tmp_path), estimate=False)
    _resumed(report, 2)
    assert report.ranks[0]["records"][0]["saved_on_ranks"] == 4
    assert report.losses[:2] == reference.losses[:2]
    # Another split of the batch (and of the matmuls under tp) rounds differently (~1e-7).
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    assert report.losses[2] != report.losses[0]  # the run went on from the saved weights


def test_async_saves_resume_bit_for_bit(two, tmp_path):
    """``dcp.async_save``: training goes on while a thread writes; the checkpoints are the
    blocking ones' and resume the same."""
    reference = labkit.train(two, _config(strategy="fsdp"), estimate=False)
    config = _config(strategy="fsdp", checkpoint_dir=tmp_path, checkpoint_every=1,
                     checkpoint_async=True, steps=3)
    first = labkit.train(two, config, estimate=False)
    assert first.losses == reference.losses[:3]
    assert _saved(tmp_path) == ["step-00000001", "step-00000002", "step-00000003"]
    for record in first.ranks[1]["records"]:
        assert record["checkpoint_write_s"] >= record["checkpoint_s"] > 0
        assert record["checkpoint_bytes"] > 0
    report = labkit.train(two, config.replace(steps=STEPS), estimate=False)
    _resumed(report, 3)
    _assert_identical(reference, report)
    with pytest.raises(ValueError, match="needs a checkpoint_dir"):
        resolve(labkit.TrainConfig(checkpoint_async=True), 1)


def test_damaged_partial_and_foreign_checkpoints(two, tmp_path):
    config = _config(strategy="fsdp", checkpoint_dir=tmp_path, checkpoint_every=2)
    reference = labkit.train(two, config, estimate=False)  # saves steps 2, 4 and 5
    assert _saved(tmp_path) == ["step-00000002", "step-00000004", "step-00000005"]
    (tmp_path / "step-00000005" / "COMPLETE.json").unlink()  # a save that never finished
    shard = tmp_path / "step-00000004" / "__1_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])  # truncated
    with pytest.warns(CheckpointWarning) as caught:
        report = labkit.train(two, config, estimate=False)
    said = " ".join(str(w.message) for w in caught)
    assert "step-00000005 has no COMPLETE.json" in said and "truncated" in said
    assert report.ranks[0]["resumed_from"] == "step-00000002"
    assert report.losses == reference.losses
    other = labkit.TrainConfig(model="gpt", strategy="fsdp", global_batch=16, steps=2,
                               checkpoint_dir=tmp_path)
    with pytest.raises(CheckpointError, match="another run"):
        labkit.train(two, other, estimate=False)


def test_a_checkpoint_dcp_cannot_read_is_passed_over(two, tmp_path):
    """Damage the sizes do not show (a shard's bytes overwritten): DCP fails on every rank
    alike, and the checkpoint before it is used."""
    config = _config(strategy="fsdp", checkpoint_dir=tmp_path, checkpoint_every=2)
    reference = labkit.train(two, config.replace(steps=4), estimate=False)
    shard = tmp_path / "step-00000004" / "__0_0.distcp"
    shard.write_bytes(bytes(shard.stat().st_size))
    report = labkit.train(two, config, estimate=False)
    assert report.ranks[0]["resumed_from"] == "step-00000002"
    assert report.losses[:4] == reference.losses


def test_checkpoint_fields_are_checked_before_any_rank_starts(two, tmp_path):
    with pytest.raises(ValueError, match="needs a checkpoint_dir"):  # the run resolved
        resolve(labkit.TrainConfig(checkpoint_every=2), 1)
    with pytest.raises(TypeError, match="whole number"):
        labkit.TrainConfig(checkpoint_dir=tmp_path, checkpoint_every=1.5)
    with pytest.raises(TypeError, match="must be a path"):
        labkit.TrainConfig(checkpoint_dir=3)
    assert labkit.TrainConfig(checkpoint_dir=tmp_path).checkpoint_dir == str(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty folder: a fresh start, nothing to say
        labkit.train(two, _config(strategy="ddp", steps=1, checkpoint_dir=tmp_path / "new"),
                     estimate=False)
    marker = json.loads((tmp_path / "new" / "step-00000001" / "COMPLETE.json").read_text())
    assert marker["step"] == 1 and marker["world_size"] == 2


def _train_killed_while_saving(ctx, config_dict: dict, at_step: int):
    """``train_on_rank`` with rank 0 SIGKILLed while the save after ``at_step`` steps
    commits: every shard is written, the marker and the rename are not."""
    from labkit.training.checkpoint import session

    original = session.commit

    def commit(tmp, final, step, *args):
        if step == at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        return original(tmp, final, step, *args)

    session.commit = commit
    try:
        return loop.train_on_rank(ctx, config_dict)
    finally:
        session.commit = original


def test_a_save_killed_half_way_is_never_the_latest(two, tmp_path):
    config = _config(strategy="fsdp", checkpoint_dir=tmp_path, checkpoint_every=2)
    reference = labkit.train(two, config.replace(checkpoint_dir=None, checkpoint_every=None),
                             estimate=False)
    with pytest.raises(labkit.RankError, match="rank 0"):
        two.run(_train_killed_while_saving, resolve(config, 2).to_dict(), 4, timeout=120)
    assert _saved(tmp_path) == ["step-00000002", "step-00000004.tmp"]
    report = labkit.train(two, config, estimate=False)
    _resumed(report, 2)
    _assert_identical(reference, report)
    assert _saved(tmp_path) == ["step-00000002", "step-00000004", "step-00000005"]


def test_a_checkpoint_dir_that_cannot_be_a_folder_is_refused_before_any_rank_starts(
        two, tmp_path):
    """Found by review: a file in checkpoint_dir's place trained every step on every rank,
    then failed at the first save with NotADirectoryError from inside rank 0."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    for where in (blocker, blocker / "below"):
        with pytest.raises(CheckpointError, match="is a file, not a folder"):
            labkit.train(two, _config(strategy="ddp", checkpoint_dir=where), estimate=False)


def _open_descriptors(ctx) -> int:
    return len(os.listdir("/proc/self/fd"))


def test_async_saves_leave_no_descriptors_behind_on_the_ranks(two, tmp_path):
    """Found by review: each run with checkpoint_async left its gloo group's sockets and
    pipes open on every rank (ranks outlive runs: 30 more descriptors after 6 runs)."""
    def run(i: int) -> None:
        config = _config(strategy="ddp", steps=2, return_weights=False,
                         checkpoint_dir=tmp_path / str(i), checkpoint_every=1,
                         checkpoint_async=True)
        labkit.train(two, config, estimate=False)

    run(0)  # first-run set-up (caches, threads) is not a leak
    before = two.run(_open_descriptors)
    for i in range(1, 4):
        run(i)
    assert two.run(_open_descriptors) == before


def test_a_relative_checkpoint_dir_is_the_notebook_s(two, tmp_path, monkeypatch):
    """Found by review: a relative checkpoint_dir was checked in the notebook's working
    folder but written in the ranks' (the folder when the cluster started): after a
    ``%cd`` the checkpoints landed elsewhere, and the refusals looked at the wrong folder."""
    monkeypatch.chdir(tmp_path)
    report = labkit.train(two, _config(strategy="ddp", steps=1, return_weights=False,
                                       checkpoint_dir="relative-ck"), estimate=False)
    assert (tmp_path / "relative-ck" / "step-00000001" / "COMPLETE.json").is_file()
    assert report.config.checkpoint_dir == str(tmp_path / "relative-ck")
    monkeypatch.setenv("HOME", str(tmp_path))
    report = labkit.train(two, _config(strategy="ddp", steps=1, return_weights=False,
                                       checkpoint_dir="~/home-ck"), estimate=False)
    assert report.config.checkpoint_dir == str(tmp_path / "home-ck")


def _train_with_a_failing_commit(ctx, config_dict: dict):
    """``train_on_rank`` where rank 0's commit of an async save fails (as on a full disk)."""
    from labkit.training.checkpoint import session

    def commit(self, done):
        raise OSError(28, "No space left on device (planted)")

    original = session.Checkpointer._commit
    session.Checkpointer._commit = commit
    try:
        return loop.train_on_rank(ctx, config_dict)
    finally:
        session.Checkpointer._commit = original


def test_a_failed_commit_of_an_async_save_is_raised_not_hung(two, tmp_path):
    """Found by review: rank 0 commits an async save from DCP's thread, whose executor drops
    what a callback raises; the event the run waits on was never set and the run hung. The
    error now ends the run, in seconds, naming the cause."""
    config = _config(strategy="ddp", checkpoint_dir=tmp_path, checkpoint_every=1,
                     checkpoint_async=True, steps=2)
    with pytest.raises(labkit.RankError, match="No space left on device"):
        two.run(_train_with_a_failing_commit, resolve(config, 2).to_dict(), timeout=60)


def test_prune_keeps_this_runs_newest_and_clears_dead_saves(tmp_path):
    """``checkpoint_keep``: after a commit, rank 0 deletes this run's checkpoints older than
    its newest ``keep`` and saves of earlier steps left half-written by a kill; another run's
    checkpoints, and a save of a later step, are left alone."""
    from labkit.training.checkpoint.store import commit, prune, step_dir, tmp_dir

    mine, other = _config().to_dict(), _config(seed=7).to_dict()

    def save(config_dict, step):
        tmp = tmp_dir(tmp_path, step)
        tmp.mkdir()
        (tmp / "__0_0.distcp").write_bytes(b"x" * step)
        commit(tmp, step_dir(tmp_path, step), step, config_dict, 1, "1 device")

    for step in (1, 2, 3, 4):
        save(mine, step)
    save(other, 5)
    tmp_dir(tmp_path, 3).with_name("step-00000000.tmp").mkdir()  # a save killed long ago
    tmp_dir(tmp_path, 9).mkdir()  # not older than the step just committed: left
    gone = prune(tmp_path, mine, 4, keep=2)
    assert sorted(gone) == ["step-00000000.tmp", "step-00000001", "step-00000002"]
    assert _saved(tmp_path) == ["step-00000003", "step-00000004", "step-00000005",
                                "step-00000009.tmp"]
    assert prune(tmp_path, mine, 4, keep=None) == []  # keep None: complete ones all stay
    for bad in (0, -1, 1.5):
        with pytest.raises((ValueError, TypeError), match="checkpoint_keep"):
            _config(checkpoint_dir=tmp_path, checkpoint_keep=bad)
    with pytest.raises(ValueError, match="needs a checkpoint_dir"):
        resolve(_config(checkpoint_keep=2), 1)


def test_a_run_that_keeps_two_checkpoints_resumes_exactly(two, tmp_path):
    """Five saves with ``checkpoint_keep=2`` leave the last two; a longer run resumes from
    the newest, bit for bit."""
    reference = labkit.train(two, _config(strategy="ddp"), estimate=False)
    config = _config(strategy="ddp", checkpoint_dir=tmp_path, checkpoint_every=1,
                     checkpoint_keep=2, steps=3)
    labkit.train(two, config, estimate=False)
    assert _saved(tmp_path) == ["step-00000002", "step-00000003"]
    report = labkit.train(two, config.replace(steps=STEPS), estimate=False)
    _resumed(report, 3)
    _assert_identical(reference, report)
    assert _saved(tmp_path) == ["step-00000004", "step-00000005"]
