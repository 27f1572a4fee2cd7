"""Exceptions a learner sees when something goes wrong on the cluster."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """Base class for every failure of a :class:`labkit.Cluster`."""


class RankError(ClusterError):
    """A rank raised an exception, or its process died.

    Attributes:
        rank: the rank that failed first.
        remote_traceback: the traceback text formatted on that rank ("" if it died).
        exitcode: the process exit status if the rank died (negative: killed by that signal).
        exception: the original exception object, when it could be sent back.
        others: short descriptions of ranks that failed after it (often as a consequence).
    """

    def __init__(self, rank: int, message: str, remote_traceback: str = "",
                 exitcode: int | None = None, exception: BaseException | None = None,
                 others: tuple[str, ...] = ()):
        self.rank = rank
        self.message = message
        self.remote_traceback = remote_traceback
        self.exitcode = exitcode
        self.exception = exception
        self.others = others
        text = f"rank {rank}: {message}"
        if others:
            text += "\n(then: " + "; ".join(others) + ")"
        if remote_traceback:
            text += f"\n\nRemote traceback (rank {rank}):\n{remote_traceback.rstrip()}"
        text += "\n\nThe cluster restarts its ranks on the next run."
        super().__init__(text)

    def __reduce__(self):
        return (type(self),
                (self.rank, self.message, self.remote_traceback, self.exitcode, None, self.others))


class RunTimeout(ClusterError, TimeoutError):
    """``Cluster.run(..., timeout=s)`` expired; the ranks were stopped."""
