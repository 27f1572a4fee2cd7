"""The notebook's side of a run: take in every rank's answer, and turn failures into errors
that name the rank that caused them (an OOM, a dead rank, the first exception, or, for a run
that timed out, the ranks that held it up rather than those waiting for them)."""

from __future__ import annotations

import signal
import time

from labkit.runtime.cluster.errors import RankError, RunTimeout
from labkit.runtime.cluster.messages import in_collective, user_frame
from labkit.runtime.cluster.output import drain
from labkit.runtime.cluster.untrusted import loads
from labkit.runtime.memory import DeviceOOM

FAILURE_GRACE_S = 0.3  # after a first failure, wait this long for the others' reports
POLL_S = 0.1
WHERE_WAIT_S = 1.0  # how long busy ranks get to say where they are when a run times out


def collect(procs, job_id: int, world_size: int, deadline: float | None, timeout,
            progress) -> list[bytes]:
    """Every rank's pickled result, in rank order; raises on the first failure."""
    results: dict[int, bytes] = {}
    failures: list[tuple] = []
    first_failure = None
    pending = set(range(world_size))
    while pending:
        for handle, message in procs.poll(pending, POLL_S):
            kind = message[0]
            if kind == "progress" and message[1] == job_id:
                progress.update(handle.rank, *message[2:])
            elif kind == "result" and message[1] == job_id:
                results[handle.rank] = message[2]
                pending.discard(handle.rank)
            elif kind in ("error", "died"):
                failures.append((handle, message))
                pending.discard(handle.rank)
                first_failure = first_failure or time.monotonic()
        now = time.monotonic()
        if first_failure and (not pending or now - first_failure > FAILURE_GRACE_S):
            raise rank_error(procs, failures)
        if deadline is not None and now > deadline:
            raise timeout_error(procs, pending, timeout)
    drain(procs.streams())  # what ranks printed before they answered, all of it
    return [results[rank] for rank in range(world_size)]


def load_results(blobs: list[bytes]) -> list:
    """Unpickle each rank's result; one that cannot be rebuilt here names its rank."""
    values = []
    for rank, blob in enumerate(blobs):
        try:
            values.append(loads(blob))
        except Exception as exc:  # noqa: BLE001 - e.g. a class that exists only on the ranks
            raise RankError(rank, f"its result could not be rebuilt in the notebook: "
                            f"{type(exc).__name__}: {exc}. Return plain Python values or "
                            "tensors, or make the result's class importable here",
                            exception=exc, restarted=False) from exc
    return values


def describe(procs, handle, message: tuple) -> tuple[str, str, str]:
    """(short, long message, remote traceback) for an 'error' or 'died' message."""
    if message[0] == "died":
        code = procs.exitcode(handle.pid)
        if code is not None and code < 0:
            how = f"killed by signal {signal.Signals(-code).name}"
        else:
            how = f"exit code {code}" if code is not None else "exit code unknown"
        return f"died ({how})", f"process {handle.pid} died ({how})", ""
    _, _, type_name, text, tb, _ = message
    return f"raised {type_name}", f"{type_name}: {text}", tb


def _exception(message: tuple) -> tuple[BaseException | None, str]:
    """The rank's exception object rebuilt here, or None and why not."""
    if message[0] != "error" or message[5] is None:
        return None, ""
    try:
        return loads(message[5]), ""
    except Exception as exc:  # noqa: BLE001 - its class may exist only on the ranks
        return None, f" (its exception could not be rebuilt here: {type(exc).__name__}: {exc})"


def rank_error(procs, failures: list) -> RankError | DeviceOOM:
    # The root cause first: an OOM anywhere, then a rank that died (its peers' collectives
    # fail *because* it died, and their reports can arrive first), then the first error.
    def cause(failure) -> int:
        message = failure[1]
        if message[0] == "error" and message[2] == "DeviceOOM":
            return 0
        return 1 if message[0] == "died" else 2

    failures = sorted(failures, key=cause)
    handle, message = failures[0]
    _, text, tb = describe(procs, handle, message)
    exitcode = procs.exitcode(handle.pid) if message[0] == "died" else None
    exception, note = _exception(message)
    if isinstance(exception, DeviceOOM):
        exception.remote_traceback = tb
        return exception
    others = tuple(f"rank {h.rank}: {describe(procs, h, m)[0]}" for h, m in failures[1:])
    return RankError(handle.rank, text + note, tb, exitcode, exception, others)


def _where(procs, pending: set[int]) -> dict[int, list]:
    """Ask busy ranks where their main thread is; ranks that cannot answer are left out."""
    token = time.monotonic_ns()
    for handle in procs.ranks:
        if handle.rank in pending:
            try:
                handle.conn.send(("where", token))
            except OSError:
                pass
    answers: dict[int, list] = {}
    deadline = time.monotonic() + WHERE_WAIT_S
    while len(answers) < len(pending) and time.monotonic() < deadline:
        for handle, message in procs.poll(pending - set(answers), 0.05):
            if message[0] == "where" and message[1] == token:
                answers[handle.rank] = message[2]
    return answers


def timeout_error(procs, pending: set[int], timeout) -> RunTimeout:
    """Name the ranks that held the run up: those not waiting inside a collective."""
    answers = _where(procs, pending)
    where, stuck, waiting = {}, [], []
    for rank in sorted(pending):
        frames = answers.get(rank)
        collective = in_collective(frames) if frames else None
        if frames is None:
            where[rank] = "did not answer (busy in code that holds Python's lock)"
            stuck.append(rank)
        elif collective:
            where[rank] = f"waiting in {collective} (at {user_frame(frames)})"
            waiting.append(rank)
        else:
            where[rank] = f"running {user_frame(frames)}"
            stuck.append(rank)
    if not stuck:  # all in collectives: mismatched calls; every rank is part of it
        stuck, waiting = waiting, []
    lines = [f"run did not finish within {timeout} s; "
             + _ranks(stuck) + (" held it up" if waiting else " were still running")
             + (f" while {_ranks(waiting)} waited in a collective" if waiting else "") + ":"]
    lines += [f"  rank {rank}: {where[rank]}" for rank in sorted(pending)]
    lines.append("Every rank was stopped; the cluster restarts its ranks on the next run.")
    return RunTimeout("\n".join(lines), tuple(stuck), tuple(waiting), where)


def _ranks(ranks: list[int]) -> str:
    return (f"rank {ranks[0]}" if len(ranks) == 1
            else "ranks " + ", ".join(str(r) for r in ranks))
