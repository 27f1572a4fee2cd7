"""The OOM boundary once per memory lever: how far each lever moves it.

Every (model size, device count) cell of every lever is *estimated* (``estimate_memory``
traces the step on fake tensors: exact for these models, and no memory is allocated, so a
map of many cells costs seconds, not a training run per cell). A few cells per lever are then
trained for real under the capacity to confirm the estimate where it matters: on one device,
the largest size predicted to fit and the smallest predicted not to, the two cells either
side of that lever's boundary.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from labkit.lessons.memory_wall.levers import LEVERS, PLAIN
from labkit.models import count_parameters, sized
from labkit.runtime.memory.oom import DeviceOOM
from labkit.runtime.memory.units import parse_bytes
from labkit.training.api import checked, train
from labkit.training.config import TrainConfig
from labkit.training.estimate import estimate_memory


@dataclass
class LeverCell:
    params: int
    world_size: int
    predicted_bytes: int  # the estimator's peak per device
    predicted_fits: bool
    measured_fits: bool | None = None  # None: not trained (estimated only)
    measured_bytes: int | None = None  # measured peak, or at the OOM in use + asked for


@dataclass
class LeverBoundary:
    """One lever's map: every cell estimated, a few trained."""

    lever: str
    options: dict
    cells: list[LeverCell] = field(default_factory=list)

    def cell(self, params: int, world_size: int) -> LeverCell:
        return next(c for c in self.cells if c.params == params and c.world_size == world_size)

    def largest_fitting(self, world_size: int) -> int | None:
        """The largest model the estimator says fits on ``world_size`` devices."""
        return max((c.params for c in self.cells if c.world_size == world_size
                    and c.predicted_fits), default=None)

    @property
    def confirmed(self) -> list[LeverCell]:
        return [c for c in self.cells if c.measured_fits is not None]

    def to_dict(self) -> dict:
        return asdict(self)


def _confirm_cell(cluster, config: TrainConfig, cell: LeverCell, capacity: int) -> None:
    try:
        report = train(cluster, config, memory_per_device=capacity, estimate=False)
        cell.measured_fits, cell.measured_bytes = True, max(report.peak_bytes)
    except DeviceOOM as oom:
        cell.measured_fits = False
        cell.measured_bytes = oom.in_use_bytes + oom.requested_bytes


def _edge(boundary: LeverBoundary, sizes: list[int]) -> list[int]:
    """On one device: the largest size predicted to fit and the next one up (if any)."""
    sizes = sorted(sizes)  # the caller's order is the user's: any
    fitting = [p for p in sizes if boundary.cell(p, 1).predicted_fits]
    above = [p for p in sizes if not boundary.cell(p, 1).predicted_fits
             and p > max(fitting, default=0)]
    return fitting[-1:] + above[:1]


def _from_measured(boundary) -> LeverBoundary:
    """A ``BoundaryMap`` (every cell trained, ``sweep_boundary``) as the plain lever's map."""
    return LeverBoundary("plain", dict(PLAIN), [
        LeverCell(c.params, c.world_size, c.predicted_bytes, c.predicted_fits, c.fits,
                  c.peak_bytes) for c in boundary.cells])


def _estimated(name: str, options: dict, row: list, params: list[int], world_sizes,
               capacity: int) -> LeverBoundary:
    boundary = LeverBoundary(name, dict(options))
    for world_size in world_sizes:
        for n, config in zip(params, row, strict=True):
            estimate = estimate_memory(config, world_size)
            boundary.cells.append(LeverCell(n, world_size, estimate.peak_bytes,
                                            estimate.fits(capacity)))
    return boundary


def _check_plain(plain, model: str, params: list[int], world_sizes, capacity: int,
                 global_batch: int, strategy: str) -> None:
    """``plain`` must be the map these levers are compared with: a plain map trained under
    another capacity, batch, model or strategy would draw another boundary."""
    ours = (model, strategy, capacity, global_batch, sorted(params), sorted(world_sizes))
    theirs = (plain.model, plain.strategy, plain.capacity_bytes, plain.global_batch,
              plain.sizes, plain.world_sizes)
    if ours != theirs:
        raise ValueError(f"plain must be a sweep_boundary map of the same model, strategy, "
                         f"capacity, global batch, sizes and world sizes as these levers: it "
                         f"has {theirs[:4]}, these levers {ours[:4]}; pass plain=None to "
                         "estimate the plain map too")


def lever_boundaries(cluster, model: str = "gpt", sizes=(2e5, 1e6, 4e6), world_sizes=(1, 2),
                     memory_per_device="32MiB", global_batch: int = 16, steps: int = 2,
                     levers=None, plain=None, confirm: bool = True) -> list[LeverBoundary]:
    """The DDP boundary map for plain training and each lever in ``levers`` (names of
    ``labkit.lessons.memory_wall.levers.LEVERS``; default all), plain first.

    Every cell is estimated; with ``confirm``, the cells either side of each lever's boundary
    on one device are trained for real on ``cluster`` under the capacity. ``plain``: a
    ``sweep_boundary`` map of the same grid (every cell trained already) to reuse as the plain
    map. Every configuration is checked before anything runs.
    """
    capacity = parse_bytes(memory_per_device)
    levers = [levers] if isinstance(levers, str) else levers  # "bf16": one lever
    names = list(LEVERS) if levers is None else list(levers)
    unknown = [n for n in names if n not in LEVERS]
    if unknown:
        raise ValueError(f"unknown levers {unknown}: choose from {', '.join(LEVERS)}")
    if not sizes or not world_sizes:
        raise ValueError("sizes and world_sizes must name one value each at least, e.g. "
                         "sizes=(2e5, 1e6), world_sizes=(1, 2)")
    by_params = {count_parameters(m): m for m in (sized(model, int(float(s))) for s in sizes)}
    params, models = list(by_params), list(by_params.values())  # sizes giving one model: once
    world_sizes = sorted(set(world_sizes))
    base = [TrainConfig(model=m, global_batch=global_batch, steps=steps, strategy="ddp")
            for m in models]
    if plain is not None:
        _check_plain(plain, model, params, world_sizes, capacity, global_batch, base[0].label)
    options = {"plain": PLAIN} if plain is None else {}
    options.update({name: LEVERS[name] for name in names})
    configs = {name: [c.replace(**opts) for c in base] for name, opts in options.items()}
    for row in configs.values():
        for config in row:
            for world_size in world_sizes:
                checked(cluster, config, world_size)
    maps = [] if plain is None else [_from_measured(plain)]
    maps += [_estimated(name, options[name], configs[name], params, world_sizes, capacity)
             for name in configs]
    if confirm and 1 in world_sizes:
        with cluster.resized(1):
            for boundary in maps[0 if plain is None else 1:]:
                row = configs[boundary.lever]
                for n in _edge(boundary, params):
                    _confirm_cell(cluster, row[params.index(n)], boundary.cell(n, 1), capacity)
    return maps
