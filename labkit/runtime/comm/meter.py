"""Communication of one step, by mesh dimension and collective, the same for every layout.

``CollectiveMeter`` (``intercept.py``) calls :meth:`CommMeter.record` for every collective
and point-to-point transfer a step issues, with the group it ran on; the meter files it under
that group's mesh dimension ("pp", "dp", "fsdp", "tp"; "world" for any other group). A
collective that completes in the background (its callback records it) is counted in flight
until it has; :meth:`settle`, which the ``with`` block calls on leaving, waits until nothing
is: a step's communication is complete, and belongs to that step, before anyone reads it.
The meter holds no reference to a collective's tensors, so it keeps no memory alive.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from labkit.runtime.comm.clock import HostClock
from labkit.runtime.costs import ring_share


@dataclass
class CommStat:
    """One (mesh dimension, collective) of a step, on one rank.

    Attributes:
        dim: "pp", "dp", "fsdp", "tp", or "world" (a group that is not a mesh dimension).
        kind: "all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all",
            "reduce", "send", "recv".
        calls: how many were issued.
        bytes: the full tensors they worked on (the AllReduced gradient, the gathered
            parameter, the activation sent).
        wire_bytes: what this rank sent for them over a ring (``labkit.runtime.costs.ring_share``).
        seconds: time from issue to completion, summed (they may overlap each other and the
            computation).
    """

    dim: str
    kind: str
    calls: int = 0
    bytes: int = 0
    wire_bytes: float = 0.0
    seconds: float = 0.0


def totals_by_kind(stats) -> dict[str, list]:
    """{collective: [calls, tensor bytes, bytes sent per rank]} of ``stats`` (CommStat rows),
    summed over mesh dimensions."""
    out: dict[str, list] = {}
    for stat in stats:
        counts = out.setdefault(stat.kind, [0, 0, 0.0])
        counts[0] += stat.calls
        counts[1] += stat.bytes
        counts[2] += stat.wire_bytes
    return out


def _world(group) -> str:
    return "world"


SETTLE_TIMEOUT_S = 600.0  # a collective of the step that never completes: an error, not a hang


class Once:
    """``fn()`` the first time it is called, never again (thread-safe)."""

    def __init__(self, fn):
        self._fn, self._lock = fn, threading.Lock()

    @property
    def fired(self) -> bool:
        return self._fn is None

    def __call__(self) -> None:
        with self._lock:
            fn, self._fn = self._fn, None
        if fn is not None:
            fn()


class CommMeter:
    """Collectives of one step: ``record`` may be called from communication threads (a
    work's completion callback), so it takes a lock.

    ``clock`` takes the marks (``runtime/comm/clock.py``), ``label(group)`` names the mesh dimension
    of a group; ``tag`` is filed with each record (per-layer attribution).
    """

    def __init__(self, clock=None, label=None):
        self.clock = clock or HostClock()
        self.label = label or _world
        self.tag = None
        self._lock = threading.Lock()
        self._finished = threading.Condition(self._lock)
        self._in_flight = 0  # collectives whose completion callback has not run yet
        self._watched: list[tuple] = []  # (weak ref to a work proxy, its Once)
        self._raw: list[tuple] = []  # (dim, kind, bytes, wire, start mark, end mark, tag)
        self.entries: list[tuple] = []  # resolved: (dim, kind, bytes, wire, start, end, tag)

    def record(self, group, kind: str, nbytes: int, group_size: int, start, end) -> None:
        """One collective of ``kind`` on a tensor of ``nbytes`` among ``group_size`` ranks of
        ``group``, between the clock's marks ``start`` and ``end``."""
        wire = nbytes * ring_share(kind, group_size)
        with self._lock:
            self._raw.append((self.label(group), kind, nbytes, wire, start, end, self.tag))

    def begin(self) -> None:
        """A collective is in flight; its completion callback will call :meth:`end`."""
        with self._lock:
            self._in_flight += 1

    def end(self) -> None:
        with self._finished:
            self._in_flight -= 1
            self._finished.notify_all()

    def watch(self, work, once: Once) -> None:
        """A point-to-point work (a proxy that calls ``once`` when waited for): if the caller
        never waits for it, :meth:`settle` does (or, if it is gone, records it then)."""
        with self._lock:
            self._watched.append((weakref.ref(work), once))

    def settle(self, wait: bool = True) -> None:
        """Wait until every collective issued is recorded, then resolve the marks.
        ``wait=False`` (after an error: a peer may be gone) resolves what was recorded."""
        with self._lock:
            watched, self._watched = self._watched, []
        if not wait:
            try:
                self._resolve()
            except RuntimeError:  # a device mark of work that never ran: nothing to report
                pass
            return
        for ref, once in watched:
            work = ref()
            if work is not None and not once.fired:
                work.wait()
            once()
        with self._finished:
            if not self._finished.wait_for(lambda: self._in_flight == 0, SETTLE_TIMEOUT_S):
                raise RuntimeError(f"{self._in_flight} collectives of this step did not "
                                   f"complete within {SETTLE_TIMEOUT_S:.0f} s")
        self.clock.synchronize()
        self._resolve()

    def _resolve(self) -> None:
        with self._lock:
            raw, self._raw = self._raw, []
        seconds = self.clock.seconds
        self.entries += [(dim, kind, n, wire, seconds(a), seconds(b), tag)
                         for dim, kind, n, wire, a, b, tag in raw]

    # ----- what the step sent (after settle) ---------------------------------------------
    @property
    def stats(self) -> list[CommStat]:
        """One CommStat per (dimension, collective), in the order they first ran."""
        out: dict[tuple[str, str], CommStat] = {}
        for dim, kind, nbytes, wire, start, end, _ in self.entries:
            stat = out.setdefault((dim, kind), CommStat(dim, kind))
            stat.calls += 1
            stat.bytes += nbytes
            stat.wire_bytes += wire
            stat.seconds += end - start
        return list(out.values())

    @property
    def intervals(self) -> list[tuple[float, float]]:
        return [(start, end) for _, _, _, _, start, end, _ in self.entries]

    @property
    def bytes(self) -> int:
        return sum(e[2] for e in self.entries)

    @property
    def wire_bytes(self) -> float:
        return sum(e[3] for e in self.entries)

    @property
    def calls(self) -> int:
        return len(self.entries)

    @property
    def by_kind(self) -> dict[str, list]:
        """{collective: [calls, tensor bytes, bytes sent per rank]}, summed over dimensions."""
        return totals_by_kind(self.stats)

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


def time_outside(windows, excluded) -> float:
    """Seconds covered by ``windows`` but not by ``excluded`` (both lists of (start, end)):
    |W minus E| = |W or E| - |E|."""
    return union_seconds([*windows, *excluded]) - union_seconds(excluded)
