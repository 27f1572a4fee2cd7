"""Exceptions and warnings a learner sees when something goes wrong on the cluster."""

from __future__ import annotations

RESTART_NOTE = "The cluster restarts its ranks on the next run."


class OversubscriptionWarning(UserWarning):
    """More CPU ranks than physical cores: ranks share cores, so timings are not per-device."""


class ClusterError(RuntimeError):
    """Base class for every failure of a ``labkit.Cluster``."""


class RankError(ClusterError):
    """A rank raised an exception, or its process died.

    Attributes:
        rank: the rank that failed first.
        remote_traceback: the traceback text formatted on that rank ("" if it died).
        exitcode: the process exit status if the rank died (negative: killed by that signal).
        exception: the original exception object, when it could be sent back.
        others: short descriptions of ranks that failed after it (often as a consequence).
        restarted: whether the ranks were stopped (they restart on the next run, and
            ``ctx.state`` starts empty); False when only the notebook's side failed.
    """

    def __init__(self, rank: int, message: str, remote_traceback: str = "",
                 exitcode: int | None = None, exception: BaseException | None = None,
                 others: tuple[str, ...] = (), restarted: bool = True):
        self.rank = rank
        self.message = message
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.exception = exception
        self.others = others
        self.restarted = restarted
        text = f"rank {rank}: {message}"
        if others:
            text += "\n(then: " + "; ".join(others) + ")"
        if remote_traceback:
            text += f"\n\nRemote traceback (rank {rank}):\n{remote_traceback.rstrip()}"
        text += "\n\n" + (RESTART_NOTE if restarted else "The ranks are still up, with "
                                                          "their ctx.state.")
        super().__init__(text)

    def __reduce__(self):
        return (type(self), (self.rank, self.message, self.remote_traceback, self.exitcode,
                             None, self.others, self.restarted))


class RunTimeout(ClusterError, TimeoutError):
    """``Cluster.run(..., timeout=s)`` expired; the ranks were stopped.

    Attributes:
        ranks: the ranks that held the run up (running their own code, or not answering).
        waiting: the ranks that were waiting for them inside a collective.
        where: for each rank, where it was when the time ran out (a short text).
    """

    def __init__(self, message: str, ranks: tuple[int, ...] = (),
                 waiting: tuple[int, ...] = (), where: dict | None = None):
        super().__init__(message)
        self.ranks, self.waiting, self.where = tuple(ranks), tuple(waiting), dict(where or {})

    def __reduce__(self):
        return (type(self), (str(self), self.ranks, self.waiting, self.where))


class RanksRestartedWarning(UserWarning):
    """A rank (or the launcher) ended between runs; the ranks were started again, so
    ``ctx.state`` is empty."""
