"""Predicted against measured: the planner's step time for runs labkit can do here, beside
the median step of the same run on this machine's ranks.

The projection is for this machine's cores as the calibration measured them (CPU time, ranks
sharing cores when they outnumber them). Other programs sharing the machine slow the run
besides: each rank's time spent runnable but waiting for a core is read from the kernel
(``/proc/self/schedstat``, its run-queue delay) over the run, and the projection is stretched
by it (``load_factor``: 1 on a machine of one's own) beyond what the ranks' own sharing of
cores explains. ``predicted_alone_s`` is the projection without it."""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from labkit.layout.layout import Layout
from labkit.models import GPTConfig, MLPConfig
from labkit.plan.calibrate import Calibration, calibrate
from labkit.plan.project import project

# Classroom-sized runs of every engine: (name, model, layout, global batch, micro-batches)
_GPT = GPTConfig(vocab_size=256, seq_len=64, d_model=128, n_heads=4, n_layers=4)
_MLP = MLPConfig(d_in=256, d_hidden=1024, n_layers=4, d_out=16)
RUNS = {
    1: [("single gpt", _GPT, Layout(), 16, 1), ("single mlp", _MLP, Layout(), 256, 1)],
    2: [("ddp gpt", _GPT, Layout(dp=2, dp_kind="ddp"), 16, 1),
        ("fsdp gpt", _GPT, Layout(fsdp=2), 16, 1),
        ("tp gpt", _GPT, Layout(tp=2), 16, 1),
        ("1f1b gpt", _GPT, Layout(pp=2, schedule="1f1b"), 16, 4),
        ("ddp mlp", _MLP, Layout(dp=2, dp_kind="ddp"), 256, 1)],
    4: [("ddp gpt", _GPT, Layout(dp=4, dp_kind="ddp"), 16, 1),
        ("fsdp x tp gpt", _GPT, Layout(fsdp=2, tp=2), 16, 1),
        ("dp x pp gpt", _GPT, Layout(dp=2, pp=2, schedule="gpipe"), 16, 2)],
}


@dataclass
class Comparison:
    name: str
    world_size: int
    layout: str
    predicted_s: float
    measured_s: float
    predicted_alone_s: float = 0.0
    load_factor: float = 1.0

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def compare(cluster, runs=None, steps: int = 6, quick: bool = False) -> tuple[list, dict]:
    """Calibrate at each rank count, project each run, train it, and compare step times."""
    import labkit

    runs = runs or RUNS
    out, calibrations = [], {}
    for n, cells in runs.items():
        with cluster.resized(n):
            calib = calibrate(cluster, repeats=3 if quick else 5)
            calibrations[n] = calib
            here = calib.cluster()
            for name, model, layout, batch, micro in cells:
                predicted = project(model, layout, here, global_batch=batch,
                                    micro_batches=micro, precision="fp32")
                before = cluster.run(_sched)
                report = labkit.train(cluster, model=model, layout=layout, global_batch=batch,
                                      micro_batches=micro, steps=steps, estimate=False)
                factor = _load_factor(before, cluster.run(_sched), calib.core_share)
                out.append(Comparison(name, n, str(layout), predicted.step_s * factor,
                                      report.median_step_s, predicted.step_s, factor))
    return out, calibrations


def _sched(ctx=None) -> tuple[float, float]:
    """(wall seconds, seconds runnable but waiting for a core) of this rank, now."""
    try:
        with open("/proc/self/schedstat") as f:
            waited = int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):  # not Linux: no correction
        waited = 0.0
    return time.monotonic(), waited


def _load_factor(before, after, core_share: float) -> float:
    """How much longer the run took than on cores of its own: 1 / (the share of its
    runnable time a rank was on a core), the slowest rank's, less what ``core_share`` (the
    ranks' own sharing, already projected) explains; at least 1."""
    stretch = 1.0
    for (w0, q0), (w1, q1) in zip(before, after, strict=True):
        wall, queued = w1 - w0, q1 - q0
        if wall > 0 and queued < wall:
            stretch = max(stretch, wall / (wall - queued))
    return max(1.0, stretch / core_share)


def error_stats(comparisons) -> dict:
    errors = [abs(c.error) for c in comparisons]
    alone = [abs(c.predicted_alone_s - c.measured_s) / c.measured_s for c in comparisons
             if c.predicted_alone_s]
    return {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
            "runs": len(errors),
            "median_abs_error_alone": statistics.median(alone) if alone else None,
            "median_load_factor": statistics.median(c.load_factor for c in comparisons)}


__all__ = ["RUNS", "Calibration", "Comparison", "compare", "error_stats"]
