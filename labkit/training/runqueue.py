"""How long this rank waited for a core, step by step: an observer of the training loop.

Linux counts, per thread, the time it was runnable but not running (``/proc/self/schedstat``,
second field: run-queue delay, ns). On a machine shared with other programs, or with more
ranks than cores, that wait is part of every step time. ``after_step`` adds two readings to
the step's record, taken between steps (outside the step's timing), the process's totals at
the end of the step:

* ``sched_wall_s``: ``time.monotonic()`` now;
* ``sched_queued_s``: this rank's main thread's run-queue delay so far.

The difference between two consecutive steps' readings is that step's wall time and wait
(``labkit.lessons.planning.checkrun`` turns them into the load a run's timed steps ran under). Not
Linux: no readings.
"""

from __future__ import annotations

import time


def read_schedstat() -> float | None:
    """This thread's run-queue delay so far, in seconds (None where the kernel has none)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


class RunQueueObserver:
    """Adds ``sched_wall_s`` and ``sched_queued_s`` to each step's record (see the module)."""

    def on_build(self, run, built, config) -> None:
        pass

    def after_backward(self, run, built) -> None:
        pass

    def after_step(self, run, built, step: int, meter) -> dict:
        queued = read_schedstat()
        if queued is None:
            return {}
        return {"sched_wall_s": time.monotonic(), "sched_queued_s": queued}
