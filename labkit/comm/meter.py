"""Count and time the collectives a strategy issues, the same way for every strategy."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CommMeter:
    """Collective calls of one step: bytes moved, (start, end) wall-clock intervals, and the
    calls and bytes of each kind of collective ("all_reduce", "all_gather", ...)."""

    bytes: int = 0
    calls: int = 0
    intervals: list[tuple[float, float]] = field(default_factory=list)
    by_kind: dict[str, list[int]] = field(default_factory=dict)

    def reset(self) -> None:
        self.bytes, self.calls, self.intervals, self.by_kind = 0, 0, [], {}

    def record(self, nbytes: int, start: float, end: float, kind: str = "all_reduce") -> None:
        self.bytes += nbytes
        self.calls += 1
        self.intervals.append((start, end))
        counts = self.by_kind.setdefault(kind, [0, 0])
        counts[0] += 1
        counts[1] += nbytes

    @property
    def busy_s(self) -> float:
        """Total time inside collectives (they may overlap computation)."""
        return sum(end - start for start, end in self.intervals)

    @property
    def union_s(self) -> float:
        """Wall-clock time during which at least one collective was running."""
        total, reach = 0.0, float("-inf")
        for start, end in sorted(self.intervals):
            if end > reach:
                total += end - max(start, reach)
                reach = end
        return total
