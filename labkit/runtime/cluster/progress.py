"""A live progress bar for a run: a widget in a notebook, text in a terminal."""

from __future__ import annotations

import contextlib
import threading


def _bar_class():
    from tqdm.auto import tqdm  # a widget in a notebook, text in a terminal

    return tqdm


class RunProgress:
    """Tracks each rank's reported progress and shows the slowest rank's."""

    def __init__(self, world_size: int, enabled: bool = True, listener=None):
        self._done = [0] * world_size
        self._listener = listener  # listener(rank, done, total, desc): a widget's live view
        self._enabled = enabled
        self._bar = None

    def update(self, rank: int, done: int, total: int, desc: str) -> None:
        if self._listener is not None:
            self._listener(rank, done, total, desc)
        if not self._enabled:
            return
        self._done[rank] = done
        if self._bar is None:
            self._bar = _bar_class()(total=total, desc=desc or "run", unit="step", leave=True)
        if desc and (rank == 0 or not self._bar.desc):  # one rank's text: no flicker
            self._bar.set_description(desc, refresh=False)
        self._bar.total = total
        slowest = min(self._done)
        self._bar.update(slowest - self._bar.n)

    def out_of_memory(self) -> None:
        """The run stopped with a DeviceOOM: the bar says in which step, in a neutral colour,
        not as tqdm's red "failed" (in the lessons, running out of memory is what such a run
        was meant to show)."""
        if self._bar is None:
            return
        label = (self._bar.desc or "run").split(", rank ")[0]  # without rank 0's last loss
        self._bar.set_description(f"{label}: out of memory in step {min(self._done) + 1}",
                                  refresh=False)
        self._bar.close()
        if hasattr(self._bar, "container"):  # a notebook's widget bar: close() made it red
            self._bar.disp(bar_style="info")
        self._bar = None

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class Listeners:
    """Who hears a run's progress, per thread: a widget's background run never hears, nor
    acts on, a run another cell starts meanwhile."""

    def __init__(self):
        self._by_thread: dict[int, object] = {}

    def current(self):
        return self._by_thread.get(threading.get_ident())

    @contextlib.contextmanager
    def listening(self, listener):
        thread = threading.get_ident()
        previous = self._by_thread.get(thread)
        self._by_thread[thread] = listener
        try:
            yield
        finally:
            if previous is None:
                del self._by_thread[thread]
            else:
                self._by_thread[thread] = previous
