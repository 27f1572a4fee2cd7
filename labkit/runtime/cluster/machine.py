"""Rank counts that fit this machine: the default is one rank per GPU, or per physical core.

A virtual GPU is one CPU core. Start more CPU ranks than cores and they take turns on the
cores: memory and bytes on the wire are still exact, but times are no longer those of separate
devices. So the notebooks offer such counts (sliders, sweeps, ``oversubscribe=True``) but do
not start them by default.

    machine = fit_to_machine(wanted=4, offered=[1, 2, 4])
    machine.world_size      # 4 on a 4-GPU node or a 4-core laptop, 2 on a 2-core one
"""

from __future__ import annotations

import html
import warnings
from dataclasses import dataclass

from labkit.runtime.cluster.cluster import Cluster
from labkit.runtime.cluster.errors import OversubscriptionWarning
from labkit.runtime.cluster.hardware import gpu_count, physical_cores


@dataclass(frozen=True)
class MachineFit:
    """The rank count chosen for this machine, and why.

    Attributes:
        wanted: what the lesson asks for; world_size: what it gets here.
        cores, gpus: this machine's physical cores and CUDA devices.
        offered: counts the lesson offers elsewhere (sliders, sweeps).
        oversubscribed: the offered counts whose ranks would share cores.
    """

    wanted: int
    world_size: int
    cores: int
    gpus: int
    offered: tuple[int, ...]
    oversubscribed: tuple[int, ...]
    oversubscribe: bool = False

    def fitting(self, counts) -> list[int]:
        """``counts`` without those that would share cores (all of them with
        ``oversubscribe``): what a sweep runs by default; the rest stay on the sliders."""
        over = set() if self.oversubscribe else {n for n in counts
                                                 if self.gpus < n and n > self.cores}
        return [n for n in counts if n not in over]

    @property
    def why(self) -> str:
        if self.gpus >= self.wanted:
            return f"{self.wanted} ranks, one per GPU."
        if self.world_size == self.wanted:
            if self.wanted > self.cores:
                asked = ("as asked (oversubscribe=True)" if self.oversubscribe
                         else "(the fewest this lesson needs)")
                return (f"{self.wanted} ranks {asked} on {self.cores} "
                        "physical cores: ranks share cores, so their times are not those of "
                        "separate devices (results say 'oversubscribed').")
            return (f"{self.wanted} rank{'s' * (self.wanted > 1)}, one per physical core "
                    "(virtual GPUs).")
        return (f"{self.world_size} rank{'s' * (self.world_size > 1)} instead of "
                f"{self.wanted}: this machine has {self.cores} physical cores and "
                f"{self.gpus or 'no'} GPUs, and a virtual GPU "
                f"is one core. More ranks would share cores and measure their turn-taking, "
                f"not separate devices. Set oversubscribe = True to start {self.wanted} anyway.")

    def _offered_line(self) -> str:
        """The counts the lesson offers (sliders, sweeps, world_size), the one started marked;
        nothing when they are only the count asked for (``why`` already says what starts)."""
        if set(self.offered) <= {self.wanted}:
            return ""
        marks = {n: [] for n in self.offered}
        for n in self.offered:
            if n == self.world_size:
                marks[n].append("started here")
            if n in self.oversubscribed:
                marks[n].append("oversubscribed")
        counts = ", ".join(f"{n} ({', '.join(m)})" if m else str(n) for n, m in marks.items())
        return f"<br>Rank counts this notebook offers: {counts}."

    def _repr_html_(self) -> str:
        return (f"<b>world_size = {self.world_size}</b>: {html.escape(self.why)}"
                + self._offered_line())

    def __repr__(self) -> str:
        return f"MachineFit(world_size={self.world_size}): {self.why}"

    def cluster(self, **options):
        """A ``Cluster`` of ``world_size`` ranks (``options``: Cluster's); its warning that
        ranks share cores is not repeated, since this fit's display says so."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OversubscriptionWarning)
            return Cluster(self.world_size, **options)


def fit_to_machine(wanted: int, offered=(), oversubscribe: bool = False,
                   at_least: int = 2) -> MachineFit:
    """``wanted`` ranks if this machine has the GPUs or the physical cores for them (or if
    ``oversubscribe``), else one per core, but never fewer than ``at_least`` (the lessons
    compare 1 device with several; on a 1-core machine that means sharing the core)."""
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise ValueError(f"wanted must be a whole number of ranks >= 1, got {wanted!r}")
    cores, gpus = physical_cores(), gpu_count()
    capacity = gpus if gpus >= 2 else cores
    world_size = wanted if oversubscribe else min(wanted, max(capacity, at_least))
    over = tuple(n for n in offered if gpus < n and n > cores)
    return MachineFit(wanted, world_size, cores, gpus, tuple(offered), over, oversubscribe)
