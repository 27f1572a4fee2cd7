"""Count and time the collectives a strategy issues, the same way for every strategy."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class CommMeter:
    """Collective calls of one step: bytes moved and (start, end) wall-clock intervals."""

    bytes: int = 0
    calls: int = 0
    intervals: list[tuple[float, float]] = field(default_factory=list)

    def reset(self) -> None:
        self.bytes, self.calls, self.intervals = 0, 0, []

    def record(self, nbytes: int, start: float, end: float) -> None:
        self.bytes += nbytes
        self.calls += 1
        self.intervals.append((start, end))

    def timed(self, nbytes: int, fn, *args, **kwargs):
        """Run a blocking collective and record it."""
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        self.record(nbytes, start, time.perf_counter())
        return out

    @property
    def busy_s(self) -> float:
        """Total time inside collectives (they may overlap computation)."""
        return sum(end - start for start, end in self.intervals)
