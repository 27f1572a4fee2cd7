"""Count and time the collectives a strategy issues, the same way for every strategy."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# What one rank sends on a ring, as a share of the tensor a collective works on, for N ranks
# (Patarasuk & Yuan 2009; NCCL's "bus bandwidth" uses the same factors): AllReduce is a
# reduce-scatter followed by an all-gather, each passing N-1 pieces of 1/N.
RING_SHARE = {"all_reduce": lambda n: 2 * (n - 1) / n}
ONE_PASS = lambda n: (n - 1) / n  # noqa: E731 - all-gather, reduce-scatter, broadcast, ...


@dataclass(eq=False)  # identity: two fresh meters are different meters
class CommMeter:
    """Collective calls of one step: bytes, (start, end) wall-clock intervals, and the calls,
    tensor bytes and ring bytes sent per rank ("wire") of each kind ("all_reduce", ...).

    ``record`` may be called from communication threads (a work's completion callback), so it
    takes a lock.
    """

    bytes: int = 0
    wire_bytes: float = 0.0
    calls: int = 0
    intervals: list[tuple[float, float]] = field(default_factory=list)
    by_kind: dict[str, list] = field(default_factory=dict)  # kind -> [calls, bytes, wire]
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def reset(self) -> None:
        with self._lock:
            self.bytes, self.wire_bytes, self.calls = 0, 0.0, 0
            self.intervals, self.by_kind = [], {}

    def record(self, nbytes: int, start: float, end: float, kind: str = "all_reduce",
               group_size: int = 2) -> None:
        """One collective on a tensor of ``nbytes`` among ``group_size`` ranks."""
        wire = nbytes * RING_SHARE.get(kind, ONE_PASS)(max(group_size, 1))
        with self._lock:
            self.bytes += nbytes
            self.wire_bytes += wire
            self.calls += 1
            self.intervals.append((start, end))
            counts = self.by_kind.setdefault(kind, [0, 0, 0.0])
            counts[0] += 1
            counts[1] += nbytes
            counts[2] += wire

    @property
    def busy_s(self) -> float:
        """Total time inside collectives (they may overlap computation)."""
        return sum(end - start for start, end in self.intervals)

    @property
    def union_s(self) -> float:
        """Wall-clock time during which at least one collective was running."""
        return union_seconds(self.intervals)


def union_seconds(intervals) -> float:
    """Seconds covered by at least one of the (start, end) ``intervals``."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
