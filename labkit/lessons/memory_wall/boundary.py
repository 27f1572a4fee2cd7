"""The OOM boundary: which (model size, device count) cells fit a memory capacity, measured
by training each cell for real, beside what the estimator predicts."""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass, field

from labkit.models import count_parameters, sized
from labkit.runtime.cluster.errors import OversubscriptionWarning
from labkit.runtime.memory.oom import DeviceOOM
from labkit.runtime.memory.units import parse_bytes
from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.estimate import estimate_memory
from labkit.training.sweep import run_cells


@dataclass
class BoundaryCell:
    params: int
    world_size: int
    fits: bool  # measured: trained without DeviceOOM
    peak_bytes: int  # measured peak, or at the OOM what was in use plus what was asked for
    predicted_bytes: int
    predicted_fits: bool


@dataclass
class BoundaryMap:
    model: str
    strategy: str
    capacity_bytes: int
    global_batch: int
    cells: list[BoundaryCell] = field(default_factory=list)

    @property
    def sizes(self) -> list[int]:
        return sorted({c.params for c in self.cells})

    @property
    def world_sizes(self) -> list[int]:
        return sorted({c.world_size for c in self.cells})

    def cell(self, params: int, world_size: int) -> BoundaryCell:
        return next(c for c in self.cells if c.params == params and c.world_size == world_size)

    @property
    def agreement(self) -> float:
        """Share of cells where the estimator predicted what the run did."""
        return sum(c.fits == c.predicted_fits for c in self.cells) / len(self.cells)

    def largest_fitting(self, world_size: int, predicted: bool = False) -> int | None:
        fitting = [c.params for c in self.cells if c.world_size == world_size
                   and (c.predicted_fits if predicted else c.fits)]
        return max(fitting, default=None)

    def to_dict(self) -> dict:
        return asdict(self)


def sweep_boundary(cluster, model: str = "gpt", sizes=(2e5, 1e6, 4e6), world_sizes=(1, 2),
                   strategy: str = "ddp", memory_per_device="64MiB", global_batch: int = 16,
                   steps: int = 2, **fields) -> BoundaryMap:
    """Train every (size, world size) cell for ``steps`` steps under the capacity.

    ``sizes`` are parameter counts (each model is sized to about that many). Every cell is
    checked before the first runs; the cluster is resized for each world size and left at
    its original size afterwards. ``fields`` are TrainConfig's (``layout=`` too). Device
    counts above the machine's cores share them, without a warning: the map is of memory,
    which sharing does not change.
    """
    capacity = parse_bytes(memory_per_device)
    result = BoundaryMap(model, strategy, capacity, global_batch)
    configs = [TrainConfig(model=sized(model, int(float(s))), global_batch=global_batch,
                           steps=steps, **fields) for s in sizes]
    if "layout" not in fields:
        configs = [c.replace(strategy=strategy) for c in configs]
    result.strategy = configs[0].label if configs else strategy
    cells = [(n, config) for n in world_sizes for config in configs]

    def run(cluster, resolved) -> BoundaryCell:  # a Run, resolved once by run_cells
        estimate = estimate_memory(resolved)
        try:
            report = train(cluster, resolved, memory_per_device=capacity, estimate=False)
            fits, peak = True, max(report.peak_bytes)
        except DeviceOOM as oom:
            fits, peak = False, oom.in_use_bytes + oom.requested_bytes
        return BoundaryCell(count_parameters(resolved.config.model), cluster.world_size, fits, peak,
                            estimate.peak_bytes, estimate.fits(capacity))

    with warnings.catch_warnings():  # memory is exact on shared cores; the map has no times
        warnings.simplefilter("ignore", OversubscriptionWarning)
        result.cells = run_cells(cluster, cells, run)
    return result
