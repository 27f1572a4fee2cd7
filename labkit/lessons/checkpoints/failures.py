"""Planted failures, and the recovery that follows: what notebook 10 and ``bench/crashes.py``
do to a checkpointed run on purpose.

``run_with_failure(cluster, config, rank, at_step, how)`` trains ``config`` (which has a
``checkpoint_dir``) on the cluster with rank ``rank`` failing once ``at_step`` steps are
done, before that step's checkpoint: its process SIGKILLed (``"kill"``, as a GPU that dies
takes its process down), an exception (``"raise"``), or stuck (``"hang"``, caught by the
run's timeout). Then it trains again: the cluster replaces the dead ranks and ``train``
resumes from the newest checkpoint. The steps done after that checkpoint were lost and are
done again.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from dataclasses import dataclass

from labkit.runtime.cluster import RankError, RanksRestartedWarning, RunTimeout
from labkit.training.api import checked
from labkit.training.checkpoint.lock import CheckpointLock

HOWS = ("kill", "raise", "hang")


class PlantedFailure(RuntimeError):
    """The failure ``run_with_failure`` plants (``how="raise"``)."""


@dataclass
class Recovery:
    """One planted failure and the run that recovered from it."""

    rank: int
    how: str
    failed_after: int  # steps done when the rank failed
    resumed_at: int  # steps in the checkpoint it resumed from
    error: str  # what the notebook was told
    report: object  # the recovered run's TrainReport (every step; resumed ones marked)

    @property
    def lost_steps(self) -> int:
        """Steps done twice: after the last checkpoint, before the failure."""
        return self.failed_after - self.resumed_at


def _fail_on_rank(ctx, run_dict: dict, rank: int, at_step: int, how: str) -> dict:
    from labkit.training.loop import train_on_rank

    if ctx.rank == rank:
        report = ctx.progress  # called once per step, after the step (before its save)

        def progress(done: int, total: int, desc: str = "") -> None:
            if done == at_step:
                if how == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                if how == "hang":
                    time.sleep(3600)
                raise PlantedFailure(f"planted failure on rank {rank} after {done} steps")
            report(done, total, desc)

        ctx.progress = progress
    try:
        return train_on_rank(ctx, run_dict)
    finally:
        ctx.__dict__.pop("progress", None)


def check_failure(cluster, config, rank: int, at_step: int, how: str) -> None:
    """Refuse a planted failure that cannot happen, before anything runs."""
    if config.checkpoint_dir is None:
        raise ValueError("a planted failure needs a config with a checkpoint_dir to resume from")
    if how not in HOWS:
        raise ValueError(f"unknown failure {how!r}: choose one of {', '.join(HOWS)}")
    if not 0 <= rank < cluster.world_size or not 1 <= at_step < config.steps:
        raise ValueError(f"rank must be in 0..{cluster.world_size - 1} and at_step in "
                         f"1..{config.steps - 1}, got rank={rank}, at_step={at_step}")


def fail_once(cluster, config, rank: int, at_step: int, how: str = "kill",
              hang_timeout: float = 20.0) -> str:
    """Train ``config`` (a TrainConfig or a resolved Run; resuming from its checkpoints)
    with rank ``rank`` failing after ``at_step`` steps; return what the notebook was told.
    ``hang_timeout``: the run's timeout when ``how="hang"`` (longer than the steps before
    the failure take)."""
    run = checked(cluster, config)  # "~/ckpt" made absolute: where labkit.train will look
    check_failure(cluster, run.config, rank, at_step, how)
    timeout = hang_timeout if how == "hang" else None
    try:
        with CheckpointLock(run.config.checkpoint_dir):
            cluster.run(_fail_on_rank, run.to_dict(), rank, at_step, how, timeout=timeout)
    except (RankError, RunTimeout) as exc:
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    raise RuntimeError(f"the planted failure on rank {rank} after {at_step} steps did not "
                       "happen: did the run resume past that step already?")


def run_with_failure(cluster, config, rank: int, at_step: int, how: str = "kill",
                     hang_timeout: float = 20.0) -> Recovery:
    """Train ``config`` with rank ``rank`` failing after ``at_step`` steps, then recover."""
    import labkit

    run = checked(cluster, config)  # resolved once: the failure and the recovery train it
    error = fail_once(cluster, run, rank, at_step, how, hang_timeout)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RanksRestartedWarning)  # expected: we killed it
        report = labkit.train(cluster, run, estimate=False)
    return Recovery(rank, how, at_step, report.ranks[0]["resumed_at"], error, report)
