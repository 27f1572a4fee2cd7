"""Predicted against measured: the planner's step time for runs labkit can do here, beside
the median step of the same run on this machine's ranks."""

from __future__ import annotations

import statistics
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
                report = labkit.train(cluster, model=model, layout=layout, global_batch=batch,
                                      micro_batches=micro, steps=steps, estimate=False)
                out.append(Comparison(name, n, str(layout), predicted.step_s,
                                      report.median_step_s))
    return out, calibrations


def error_stats(comparisons) -> dict:
    errors = [abs(c.error) for c in comparisons]
    return {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
            "runs": len(errors)}


__all__ = ["RUNS", "Calibration", "Comparison", "compare", "error_stats"]
