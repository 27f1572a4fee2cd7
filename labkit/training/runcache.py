"""Real runs kept for a widget, each under what it depends on.

A slider or picker trains a run the first time a value is chosen and shows the kept run
when it is chosen again. A kept run is served only to the same *base*: a string naming
everything the run depends on besides the chosen value (the rest of the configuration, the
ranks, their capacity), computed when the value is asked for, so that a cluster resized or
given another memory cap since trains again instead of showing a run measured elsewhere.
Used by ``labkit/lessons/memory_wall/levers.py`` (the lever picker) and
``labkit/lessons/long_context/capacity.py`` (the capacity slider).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

Run = TypeVar("Run")


class RunCache(Generic[Run]):
    """Runs by (base, value): ``get`` trains on a miss, ``put`` seeds one trained before."""

    def __init__(self):
        self._runs: dict[tuple[str, Hashable], Run] = {}

    def get(self, base: str, value: Hashable, train: Callable[[], Run]) -> Run:
        key = (base, value)
        if key not in self._runs:
            self._runs[key] = train()
        return self._runs[key]

    def __len__(self) -> int:
        return len(self._runs)

    def put(self, base: str, value: Hashable, run: Run) -> None:
        self._runs[(base, value)] = run
