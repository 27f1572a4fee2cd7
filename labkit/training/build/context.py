"""``ParallelContext``: what the build path and the step see on one rank of a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from labkit.runtime.comm.clock import clock_for
from labkit.runtime.memory.capacity import on_host
from labkit.training.layout.layout import Layout
from labkit.training.layout.mesh import GroupLabels, mesh_for


@dataclass
class ParallelContext:
    """One rank of a run: who it is, its device and memory tracker, the resolved run (its
    config, layout and engines, ``labkit/training/run.py``), the one DeviceMesh built from
    the layout (``mesh["tp"]``, ``mesh["dp", "fsdp"]``...), the clock that times its device,
    and where progress goes.

    On a cluster it is made from the rank's ``RankContext`` for the length of a run; the
    estimator makes one for a rank of a fake process group.
    """

    rank: int
    world_size: int
    device: torch.device
    memory: Any  # a MemoryTracker
    run: Any  # training/run.py's Run (not imported: labkit.training imports build)
    mesh: Any  # a DeviceMesh with dimensions ("pp", "dp", "fsdp", "cp", "tp")
    clock: Any  # comm.clock.HostClock or DeviceClock
    progress: Any = None  # progress(done, total, label), or None
    labels: GroupLabels = field(init=False)

    def __post_init__(self):
        self.labels = GroupLabels(self.layout, self.engines, self.rank)

    @property
    def layout(self) -> Layout:
        return self.run.layout

    @property
    def engines(self):
        return self.run.engines

    @property
    def config(self):
        """The run's ``TrainConfig``."""
        return self.run.config

    def coordinate(self, dim: str) -> int:
        """This rank's index along mesh dimension ``dim``."""
        return self.mesh.get_local_rank(dim)

    def group(self, dim: str):
        """The process group of this rank's ``dim`` dimension."""
        return self.mesh.get_group(dim)

    def submesh(self, *dims: str):
        """``mesh[dims]``: slicing makes a small map of ranks, a host tensor (not device
        memory)."""
        with on_host():
            return self.mesh[dims[0] if len(dims) == 1 else dims]

    @property
    def data_rank(self) -> int:
        """Which slice of the batch this rank trains on: its (dp, fsdp) coordinate."""
        return self.coordinate("dp") * self.layout.fsdp + self.coordinate("fsdp")

    def report(self, done: int, total: int, label: str) -> None:
        if self.progress is not None:
            self.progress(done, total, label)


def parallel_context(ctx, run) -> ParallelContext:
    """On a rank of a cluster (``ctx``: its ``RankContext``), the ``ParallelContext`` of
    ``run`` (resolved). Every rank must call it (the first time, it builds the mesh)."""
    return ParallelContext(ctx.rank, ctx.world_size, ctx.device, ctx.memory, run,
                           mesh_for(run.layout, ctx.device.type), clock_for(ctx.device),
                           getattr(ctx, "progress", None))
