"""Scaling sweeps: the same training at several device counts, measured, beside the ring
AllReduce model of communication time.

Strong scaling keeps the global batch fixed (the same work split more ways: does a step get
faster?). Weak scaling keeps each rank's batch fixed (more work in the same time: does
throughput grow?). A ring AllReduce of S bytes over N ranks sends 2(N-1)/N x S bytes per
rank, so with a per-link bandwidth B it takes about 2(N-1)/N x S / B seconds (Patarasuk and
Yuan, 2009; the "bus bandwidth" of NVIDIA's nccl-tests is B measured that way; the formula is
``labkit.runtime.costs.ring_all_reduce_seconds``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from labkit.models import MLPConfig, count_parameters, sized
from labkit.runtime.cluster.hardware import physical_cores
from labkit.runtime.comm.timing import time_all_reduce
from labkit.runtime.costs import ring_all_reduce_seconds
from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.sweep import run_cells

__all__ = ["COMPUTE_BOUND", "ScalingPoint", "ScalingResult", "measure_bus_bandwidth",
           "point_of", "predicted_comm_s", "reused", "ring_all_reduce_seconds",
           "scaling_sweep"]

# The compute-bound configuration the speedup bench, the speedup figure and notebook 02 use:
# a large batch over a model whose gradient is small (1.7M parameters, 6.9 MB to AllReduce per
# step against about 1 s of computation on one core of the 2-core machine the course is tested
# on; notebook 02 times it at half this batch): (model, global batch).
COMPUTE_BOUND = (MLPConfig(d_in=256, d_hidden=512, n_layers=8, d_out=16), 8192)


@dataclass
class ScalingPoint:
    world_size: int
    global_batch: int
    step_s: float
    compute_s: float
    comm_s: float  # exposed: not hidden behind computation
    comm_busy_s: float  # all time inside collectives
    samples_per_s: float
    comm_bytes: int
    predicted_comm_s: float
    oversubscribed: bool
    losses: list[float] = field(default_factory=list)


@dataclass
class ScalingResult:
    model: str
    params: int
    strategy: str
    mode: str  # "strong" or "weak"
    bus_bandwidth: float  # bytes/s, measured here with all_reduce of the gradient size
    cores: int
    points: list[ScalingPoint] = field(default_factory=list)

    def point(self, world_size: int) -> ScalingPoint:
        return next(p for p in self.points if p.world_size == world_size)

    def speedup(self, world_size: int) -> float:
        """Strong: time per step of 1 device over N. Weak: throughput of N over 1 device."""
        base, here = self.point(1), self.point(world_size)
        if self.mode == "strong":
            return base.step_s / here.step_s
        return here.samples_per_s / base.samples_per_s

    def efficiency(self, world_size: int) -> float:
        return self.speedup(world_size) / world_size

    def to_dict(self) -> dict:
        return asdict(self)


# Data-parallel strategies on one rank: one device (DDP's wrapper over one rank averages nothing)
_ONE_DEVICE = ("single", "naive_dp", "ddp")


def _same_step(report, world_size: int, config: TrainConfig) -> bool:
    """Whether ``report`` ran the step ``config`` runs on ``world_size`` ranks: the same
    configuration but for how many steps it ran and whether it returned its weights."""
    if report.world_size != world_size:
        return False
    mine, theirs = config, report.config
    if world_size == 1:
        if mine.strategy not in _ONE_DEVICE or theirs.strategy not in _ONE_DEVICE:
            return False
        mine, theirs = mine.replace(strategy="single"), theirs.replace(strategy="single")
    same = {"steps": mine.steps, "return_weights": mine.return_weights}
    return theirs.replace(**same) == mine


def reused(measured, world_size: int, config: TrainConfig):
    """The first report among ``measured`` (``labkit.train``'s) that ran this cell's step
    (``_same_step``), or None: sweeps take such runs as they are instead of training again."""
    return next((r for r in measured if _same_step(r, world_size, config)), None)


def point_of(report) -> ScalingPoint:
    """A training run as one point of a sweep (its predicted communication still 0)."""
    split = report.split()
    return ScalingPoint(report.world_size, report.config.global_batch, split["step_s"],
                        split["compute_s"], split["comm_s"], split["comm_busy_s"],
                        report.samples_per_s, report.comm_bytes_per_step, 0.0,
                        report.oversubscribed, report.losses)


def predicted_comm_s(point: ScalingPoint, comm_model=None, bus_bandwidth: float = 0.0) -> float:
    """The AllReduce time of ``point``'s gradients: ``comm_model`` (an ``AlphaBeta`` fitted over
    message sizes) on the point's rank count, else the ring formula with ``bus_bandwidth``
    (0 when neither is known, and on one rank)."""
    if point.world_size == 1:
        return 0.0
    if comm_model is not None:
        return comm_model.on_group(point.world_size).predict(point.comm_bytes)
    if bus_bandwidth:
        return ring_all_reduce_seconds(point.comm_bytes, point.world_size, bus_bandwidth)
    return 0.0


def measure_bus_bandwidth(cluster, nbytes: int) -> float:
    """Bus bandwidth (bytes/s) of an all_reduce of ``nbytes`` on this cluster (>= 2 ranks)."""
    return time_all_reduce(cluster, [max(4, nbytes)], repeats=5).bus_bandwidth


def scaling_sweep(cluster, model: str = "mlp", params: float = 1e6, world_sizes=(1, 2, 4),
                  strategy: str = "ddp", global_batch: int = 64, mode: str = "strong",
                  steps: int = 5, comm_model=None, measured=(), **fields) -> ScalingResult:
    """Train at each world size (the cluster is resized, then put back) and measure.

    The predicted communication is the ring formula with ``comm_model``'s latency and
    bandwidth (an ``AlphaBeta`` fitted over message sizes) when given; else with the bus
    bandwidth of one AllReduce of the gradients' size, measured here.

    ``global_batch`` is the batch of one device: in strong mode every world size splits it,
    in weak mode each rank gets that much (so the global batch grows with N). ``model`` is a
    zoo name (sized to ``params``) or a model config (``params`` is then ignored).
    ``measured``: reports of runs already made; a cell one of them ran (``reused``) is taken
    from it instead of trained.
    """
    if mode not in ("strong", "weak"):
        raise ValueError("mode is 'strong' (fixed global batch) or 'weak' (fixed per rank)")
    if 1 not in world_sizes:
        raise ValueError("include world size 1: speedup is measured against one device")
    chosen = sized(model, int(float(params))) if isinstance(model, str) else model
    config = TrainConfig(model=chosen, strategy=strategy, global_batch=global_batch,
                         steps=steps, **fields)
    name = model if isinstance(model, str) else type(model).__name__.removesuffix("Config")
    result = ScalingResult(name.lower(), count_parameters(config.model), strategy, mode, 0.0,
                           physical_cores())

    def run(cluster, cell) -> ScalingPoint:  # a Run, resolved once by run_cells
        report = train(cluster, cell, estimate=False)
        if cluster.world_size > 1 and not result.bus_bandwidth and comm_model is None:
            result.bus_bandwidth = measure_bus_bandwidth(cluster, report.comm_bytes_per_step)
        return point_of(report)

    cells = [(n, config.replace(global_batch=global_batch * (n if mode == "weak" else 1)))
             for n in sorted(world_sizes)]
    measured = list(measured)
    known = [reused(measured, n, cell) for n, cell in cells]
    todo = [cell for cell, report in zip(cells, known, strict=True) if report is None]
    trained = iter(run_cells(cluster, todo, run))
    result.points = [next(trained) if report is None else point_of(report) for report in known]
    if comm_model is not None:
        result.bus_bandwidth = comm_model.bandwidth
    for point in result.points:
        point.predicted_comm_s = predicted_comm_s(point, comm_model, result.bus_bandwidth)
    return result
