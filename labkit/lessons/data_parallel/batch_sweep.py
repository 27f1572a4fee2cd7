"""Where data parallelism stops paying: strong scaling of one model as the batch shrinks.

Each rank of a data-parallel step computes forward and backward on 1/N of the batch, but some
of the step does not shrink with it: every rank AllReduces the whole gradient, and every rank
runs the whole optimizer step. With a step of one device split as forward-and-backward F and
optimizer step O, a step on N ranks is about

    F / N + O + alpha + 2(N-1)/N x S / beta

(S the gradient's bytes; alpha and beta fitted over message sizes, ``CollectiveSweep.fit``).
A large batch makes F dominate and the speedup approaches N; a small one leaves the terms
that do not shrink (notebook 02, "The communication wall").

    walk = batch_sweep(cluster, TrainConfig(model=..., steps=4), [4096, 1024, 256, 64],
                       comm_model=ring)
    walk.speedup(4096), walk.point(64).predicted_speedup
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from labkit.lessons.data_parallel.scaling import (
    ScalingPoint,
    ScalingResult,
    point_of,
    predicted_comm_s,
    reused,
)
from labkit.models import count_parameters
from labkit.runtime.cluster.hardware import physical_cores
from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.sweep import run_cells

__all__ = ["BatchPoint", "BatchSweep", "batch_sweep"]


@dataclass
class BatchPoint:
    """One global batch on one device and on N, measured, beside the model's step on N."""

    global_batch: int
    one: ScalingPoint  # one device, the whole batch
    many: ScalingPoint  # N ranks, 1/N of the batch each
    optimizer_s: float  # one device's optimizer step: every rank runs it whole

    @property
    def world_size(self) -> int:
        return self.many.world_size

    @property
    def samples_per_rank(self) -> int:
        return self.global_batch // self.world_size

    @property
    def speedup(self) -> float:
        """One device's step time over N ranks' (measured)."""
        return self.one.step_s / self.many.step_s

    @property
    def predicted_step_s(self) -> float:
        """F / N + O + the AllReduce the ring model predicts (module docstring)."""
        forward_backward = self.one.step_s - self.optimizer_s
        return forward_backward / self.world_size + self.optimizer_s + self.many.predicted_comm_s

    @property
    def predicted_speedup(self) -> float:
        return self.one.step_s / self.predicted_step_s


@dataclass
class BatchSweep:
    model: str
    params: int
    strategy: str
    world_size: int
    cores: int
    points: list[BatchPoint] = field(default_factory=list)  # in the order the batches came
    reports: list = field(default_factory=list, repr=False)  # the TrainReports behind them

    def point(self, global_batch: int) -> BatchPoint:
        return next(p for p in self.points if p.global_batch == global_batch)

    def speedup(self, global_batch: int) -> float:
        return self.point(global_batch).speedup

    def strong(self, global_batch: int) -> ScalingResult:
        """That batch as a strong-scaling result over 1 and N ranks (``plot_speedup``)."""
        point = self.point(global_batch)
        return ScalingResult(self.model, self.params, self.strategy, "strong", 0.0, self.cores,
                             [point.one, point.many])

    def to_dict(self) -> dict:
        return {"model": self.model, "params": self.params, "strategy": self.strategy,
                "world_size": self.world_size, "cores": self.cores,
                "points": [{**asdict(p), "samples_per_rank": p.samples_per_rank,
                            "speedup": p.speedup, "predicted_step_s": p.predicted_step_s,
                            "predicted_speedup": p.predicted_speedup} for p in self.points]}


def batch_sweep(cluster, config: TrainConfig, batches, strategy: str = "ddp",
                comm_model=None, measured=()) -> BatchSweep:
    """Train ``config`` at each global batch of ``batches``, on one device (strategy "single")
    and on the cluster's N ranks with ``strategy``; the cluster is resized to one rank for the
    former and put back. ``comm_model`` (an ``AlphaBeta``) predicts each AllReduce.

    ``measured``: reports of runs already made (``labkit.train``); a cell that one of them ran
    (``labkit.lessons.data_parallel.scaling.reused``: the same step on as many ranks) is taken from
    it instead of trained. The sweep keeps every report it used (``reports``), for the next sweep.
    """
    n = cluster.world_size
    if n < 2:
        raise ValueError("a batch sweep compares one device with N: start 2 ranks or more")
    bad = [b for b in batches if b % n]
    if bad:
        raise ValueError(f"global batches {bad} do not split over {n} ranks: choose multiples")
    measured = list(measured)
    cells = [(size, config.replace(global_batch=b, strategy="single" if size == 1 else strategy))
             for size in (n, 1) for b in batches]
    reports = [reused(measured, size, cell) for size, cell in cells]
    todo = [cell for cell, report in zip(cells, reports, strict=True) if report is None]
    trained = iter(run_cells(cluster, todo, lambda c, cell: train(c, cell, estimate=False)))
    reports = [report or next(trained) for report in reports]
    many, one = reports[:len(batches)], reports[len(batches):]
    result = BatchSweep(config.model.name, count_parameters(config.model), strategy, n,
                        physical_cores())
    result.reports = reports
    for b, one_report, many_report in zip(batches, one, many, strict=True):
        points = [point_of(one_report), point_of(many_report)]
        points[1].predicted_comm_s = predicted_comm_s(points[1], comm_model)
        result.points.append(BatchPoint(b, *points, one_report.split()["optimizer_s"]))
    return result
