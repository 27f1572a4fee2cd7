"""Run a learner's function on the ranks without ever hanging the kernel.

Every check sends one job to every rank (the job calls the learner's function and measures
what it did). Whatever the function does, the notebook gets an answer: a result, or a
``CheckResult`` that says the exercise is not attempted yet, that the function raised (where,
on which rank), or that it hung (the ranks are stopped after ``timeout`` seconds; the cluster
starts fresh ranks on its next run, so the lesson goes on).

``at_two_sizes`` runs a check that passed once more at another rank count (CPU ranks: the
cluster is resized for it and back), so that code written for the classroom's 2 ranks only
(a hard-coded ``/ 2``, ``1 - rank`` as "the other rank") does not pass.
"""

from __future__ import annotations

import contextlib
import sys
import traceback
import warnings

from labkit.lessons.exercise.result import CheckResult, failed, not_attempted
from labkit.runtime.cluster import RankError, RunTimeout
from labkit.runtime.cluster.errors import OversubscriptionWarning
from labkit.runtime.memory import DeviceOOM, format_bytes

DEFAULT_TIMEOUT_S = 30.0  # a correct answer takes well under a second at the checks' sizes
SECOND_SIZES = {4: 2}  # the other rank count a check runs at: 4, or 2 from a 4-rank cluster
PRINT_LIMIT = 5_000  # characters of the learner's prints shown per rank and stream, per run


class _CappedStream:
    """Passes writes on to ``target`` until ``limit`` characters, then counts what it drops:
    a function that prints in a loop must not flood the notebook (or a graded copy of it)."""

    def __init__(self, target, limit: int):
        self.target, self.limit, self.written, self.dropped = target, limit, 0, 0

    def write(self, text: str) -> int:
        room = max(0, self.limit - self.written)
        if room:
            self.target.write(text[:room])
        self.written += min(room, len(text))
        self.dropped += max(0, len(text) - room)
        return len(text)

    def flush(self) -> None:
        self.target.flush()


def _capped_prints(ctx, job, *args, **kwargs):
    """Run ``job`` on a rank with its prints capped at ``PRINT_LIMIT`` characters a stream,
    and torch's process-wide defaults (dtype, grad mode) as they were afterwards: the ranks
    outlive the check, and the next check or ``labkit.train`` must not inherit a
    ``torch.set_default_dtype`` from the learner's function."""
    import torch

    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    out, err = _CappedStream(sys.stdout, PRINT_LIMIT), _CappedStream(sys.stderr, PRINT_LIMIT)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return job(ctx, *args, **kwargs)
    finally:
        torch.set_default_dtype(dtype)
        torch.set_grad_enabled(grad)
        for stream in (out, err):
            if stream.dropped:
                stream.target.write(f"\n[labkit: {stream.dropped} more characters printed "
                                    "on this rank were not shown]\n")
            stream.flush()


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
        return Outcome(values=list(cluster.run(_capped_prints, job, *args, timeout=timeout,
                                               **kwargs)))
    except TypeError as error:  # raised before any rank ran: the code cannot be sent
        if "cannot send" not in str(error):
            raise
        return Outcome(verdict=failed(
            exercise, f"{where} cannot be sent to the ranks ({error.__cause__ or error}). "
            "Does it use a variable of the notebook that lives only here, such as `cluster`? "
            "Inside the function, use what the ranks have: ctx.rank, ctx.world_size, "
            "ctx.device and the arguments."))
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


@contextlib.contextmanager
def resized(cluster, world_size: int):
    """The cluster with ``world_size`` ranks inside, its own count again afterwards (also
    after an error or a KeyboardInterrupt). Ranks past the cores are fine here: a check
    measures values and bytes, not times, so the oversubscription warning is not shown
    (it would go to stderr, which nbgrader counts as a failure)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OversubscriptionWarning)
        with cluster.resized(world_size):
            yield cluster


def at_two_sizes(cluster, check_once) -> CheckResult:
    """``check_once()`` (a verdict on ``cluster`` as it is); if that passed on CPU ranks, once
    more at a second rank count, whose verdict wins if it fails. GPU clusters are checked at
    their own size only (more ranks than GPUs would need a memory cap to share them)."""
    first = check_once()
    n = cluster.world_size
    if not first.passed or cluster.device != "cpu":
        return first
    second_size = SECOND_SIZES.get(n, 4)
    with resized(cluster, second_size):
        second = check_once()
    if second.passed:
        first.details.append(f"it passed on {second_size} ranks too (the check also runs "
                             "your code at a second rank count)")
        first.measured["also_passed_on"] = second_size
        return first
    second.summary = (f"on {second_size} ranks (it passed on {n}; the check also runs your "
                      f"code at a second rank count, so that it holds for any N): "
                      f"{second.summary}")
    return second
