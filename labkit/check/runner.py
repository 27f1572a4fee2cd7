"""Run a learner's function on the ranks without ever hanging the kernel.

Every check sends one job to every rank (the job calls the learner's function and measures
what it did). Whatever the function does, the notebook gets an answer: a result, or a
``CheckResult`` that says the exercise is not attempted yet, that the function raised (where,
on which rank), or that it hung (the ranks are stopped after ``timeout`` seconds; the cluster
starts fresh ranks on its next run, so the lesson goes on).
"""

from __future__ import annotations

import traceback

from labkit.check.result import CheckResult, failed, not_attempted
from labkit.cluster import RankError, RunTimeout
from labkit.memory import DeviceOOM, format_bytes

DEFAULT_TIMEOUT_S = 30.0  # a correct answer takes well under a second at the checks' sizes


class Outcome:
    """Per-rank values of a job, or the verdict that replaces them."""

    def __init__(self, values=None, verdict: CheckResult | None = None):
        self.values, self.verdict = values, verdict


def _learner_line(remote_traceback: str) -> str:
    """The last traceback line that points into the learner's cell (not labkit, not torch)."""
    lines = [line.strip() for line in remote_traceback.splitlines()
             if line.strip().startswith("File ")]
    mine = [line for line in lines if "site-packages" not in line and "/labkit/" not in line]
    return mine[-1] if mine else ""


def run_checked(cluster, exercise: str, where: str, job, *args, timeout: float | None = None,
                hang_hint: str = "", **kwargs) -> Outcome:
    """``cluster.run(job, *args, **kwargs)``; failures become a verdict on ``exercise``
    (``where`` names the learner's function or class in messages). The cluster's memory cap
    is lifted for the job (checks that measure memory set their own) and put back."""
    timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
    saved = cluster.memory_per_device
    try:
        cluster.memory_per_device = None
        return Outcome(values=list(cluster.run(job, *args, timeout=timeout, **kwargs)))
    except RunTimeout:
        return Outcome(verdict=failed(
            exercise, f"{where} did not finish within {timeout:g} s on the ranks: it hangs. "
            + (hang_hint or "A rank is probably waiting for a message or a collective that "
               "another rank never sends or joins."),
            ["the ranks were stopped; the cluster starts fresh ones on its next run"],
            timeout_s=timeout))
    except DeviceOOM as oom:
        return Outcome(verdict=failed(
            exercise, f"rank {oom.rank} ran out of device memory: it asked for "
            f"{format_bytes(oom.requested_bytes)} with {format_bytes(oom.in_use_bytes)} of "
            f"{format_bytes(oom.capacity_bytes)} in use.", measured_oom=oom.to_dict()))
    except RankError as error:
        if isinstance(error.exception, NotImplementedError):
            return Outcome(verdict=not_attempted(exercise, where))
        line = _learner_line(error.remote_traceback)
        return Outcome(verdict=failed(
            exercise, f"{where} raised on rank {error.rank}: {error.message}",
            [f"at {line}"] if line else [], rank=error.rank))
    finally:
        cluster.memory_per_device = saved


def describe_exception(exc: BaseException) -> str:
    """One line for an exception raised on the host while checking (a malformed answer)."""
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()
