"""What a check knows that the learner's code on the ranks cannot make up.

A learner's function runs on the ranks, in processes whose Python it can change at will: a
count it reports (``wire.Traffic``) can be patched, and inputs made from a fixed seed can be
computed on any rank without receiving them. So a check that must hold against such code
(``python -m labkit grade``, where a stranger wrote it) rests on two things from outside:

* ``private_seeds(n)``: one random seed per rank, drawn here (``secrets``) for each run and
  sent to that rank alone (``PerRank``): no rank can compute another rank's data, and the
  check computes the expected result from the seeds itself (a seed is 8 bytes a rank could
  pass on: where the bytes another rank must receive are what a check measures, it sends the
  tensors made from the seed instead);
* ``SocketCount``: the bytes that crossed each rank's TCP sockets during the run, sent and
  received, read by this process from the kernel's counters (``labkit/runtime/comm/sockets.py``),
  to set beside the bytes the rank reports and beside what the algorithm needs.

Where the kernel's counters cannot be read (not Linux, a rank whose ``/proc`` entries are
closed to this process), a check in a notebook goes on without them; the grader
(``distrusted()``) fails the exercise instead, saying why. NCCL ranks move their data over
NVLink, PCIe or shared memory, not their sockets: there the bytes are not counted.
"""

from __future__ import annotations

import secrets

from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.cluster.untrusted import distrusted
from labkit.runtime.comm.sockets import Unmeasurable, WireSnapshot

# What gloo's TCP transport adds to a message's payload, measured on its sockets (torch 2.x):
# 96 bytes per send (its header, and a notice that it is ready) and 48 per receive (a notice
# to the sender). The bounds leave a third more, for other versions of gloo.
SEND_FRAMING_BYTES, RECV_FRAMING_BYTES = 128, 64
WIRE_SLACK_BYTES = 64  # anything else a rank's sockets may carry during a run (0 measured)


def fresh_seed() -> int:
    """A random seed (63 bits) drawn for one run: no result made from it can be precomputed."""
    return secrets.randbits(63)


def private_seeds(world_size: int) -> PerRank:
    """A fresh seed for each rank, for ``cluster.run`` to hand out (rank r gets seed r only)."""
    return PerRank(fresh_seed() for _ in range(world_size))


def _ready(ctx) -> int:
    return ctx.rank


class SocketCount:
    """``count = SocketCount(cluster)`` (the ranks started if needed, then a first reading);
    run the job; ``count.sent()``: the bytes each rank wrote to its TCP sockets since
    (``count.received()``: the bytes they received), or None with ``count.problem`` saying why
    they could not be counted."""

    def __init__(self, cluster, timeout: float = 30.0):
        self.problem, self._first, self._cluster = None, None, cluster
        self.applies = cluster.backend == "gloo"  # NCCL moves data by NVLink, shared memory
        if not self.applies:
            self.problem = f"{cluster.backend} does not move its data through the ranks' sockets"
            return
        try:
            cluster.run(_ready, timeout=timeout)  # ranks up before the first reading
            self._first = WireSnapshot(self._pids())
        except Unmeasurable as why:
            self.problem = str(why)
        except Exception as exc:  # noqa: BLE001 - the check's own run reports the failure
            self.problem = f"the ranks did not answer before the run ({type(exc).__name__})"

    def _pids(self) -> list[int]:
        pids = [r.get("pid") for r in self._cluster.ranks]
        if not pids or None in pids:
            raise Unmeasurable("the ranks' process ids are not known")
        return pids

    def sent(self) -> list[int] | None:
        return self._since("sent_since")

    def received(self) -> list[int] | None:
        """The bytes each rank's sockets received since the first reading (from its peers or
        from the cluster's store), or None with ``problem`` saying why."""
        return self._since("received_since")

    def _since(self, method: str) -> list[int] | None:
        if self._first is None:
            return None
        try:
            return getattr(WireSnapshot(self._pids()), method)(self._first)
        except Unmeasurable as why:
            self.problem = str(why)
            return None

    @property
    def required(self) -> bool:
        """Whether a check must fail when the bytes cannot be counted: when grading, on
        ranks whose data crosses their sockets (gloo)."""
        return self.applies and distrusted()

    def unmeasured(self) -> str:
        return (f"the grader could not count the bytes that crossed the ranks' sockets "
                f"({self.problem}), so it cannot trust the bytes the ranks reported")


def framing_allowed(sends: int, recvs: int) -> int:
    """The most bytes gloo (and anything else) adds to the payload of ``sends`` sends and
    ``recvs`` receives on a rank's sockets."""
    return SEND_FRAMING_BYTES * sends + RECV_FRAMING_BYTES * recvs + WIRE_SLACK_BYTES


def reported_mismatch(rank: int, reported: int, sends: int, recvs: int,
                      on_wire: int) -> str | None:
    """Why the ``reported`` bytes of ``rank`` (in ``sends`` sends and ``recvs`` receives)
    cannot be what crossed its sockets (``on_wire``, the kernel's count); None if they can."""
    framing = on_wire - reported
    if 0 <= framing <= framing_allowed(sends, recvs):
        return None
    return (f"the bytes rank {rank} reported are not what crossed its sockets: {reported} "
            f"bytes in {sends} sends and {recvs} receives reported, {on_wire} counted by the "
            "kernel, outside the rank (labkit's counters on that rank were changed, or it "
            "sent by a way they do not see: a collective, a socket of its own)")
