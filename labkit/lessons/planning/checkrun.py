"""Predicted against measured: the planner's step time for runs labkit can do here, beside
the median steady step of the same run on this machine's ranks (``steady_steps``: past the
warm-up, which the projection does not model).

The projection is for this machine's cores as the calibration measured them (CPU time, ranks
sharing cores when they outnumber them). Other programs sharing the machine slow the run
besides. Each rank records, between its steps, how long it waited runnable for a core (the
kernel's run-queue delay: ``labkit.training.runqueue``); over the run's *steady* steps only (those
the measured median is taken from: set-up, the warm-up and memory-tracked steps left out),
a rank's stretch is wall / (wall - waited). The projection is stretched by it (``load_factor``,
1 on a machine of one's own) beyond what the ranks' own sharing of cores explains.

How the ranks' stretches combine (``RULES``; the bench prints the error under each):

* ``"step"`` (the default): per step, the slowest rank's stretch, then the median over the
  steps. It mirrors how the measured step is formed (the slowest rank at each step, then the
  median): in a step whose ranks meet in collectives, the step ends when the most delayed
  rank ends, and a rank's delay in one step is not carried into the median of another.
* ``"median"``: the median over ranks of each rank's whole-run stretch (robust to one rank
  that was unlucky once, but blind to the fact that one slow rank holds all others).
* ``"slowest"``: the largest whole-run stretch of any rank (the earlier rule).

``predicted_alone_s`` is the projection without it."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from labkit.models import GPTConfig, MLPConfig
from labkit.plan.calibrate import Calibration, calibrate
from labkit.plan.parallelism import Parallelism, parallelism
from labkit.plan.project import project
from labkit.training.report import timed_steps

# Classroom-sized runs of every engine: (name, model, layout, global batch, micro-batches)
_GPT = GPTConfig(vocab_size=256, seq_len=64, d_model=128, n_heads=4, n_layers=4)
_MLP = MLPConfig(d_in=256, d_hidden=1024, n_layers=4, d_out=16)
P = Parallelism.of
RUNS = {
    1: [("single gpt", _GPT, P(), 16, 1), ("single mlp", _MLP, P(), 256, 1)],
    2: [("ddp gpt", _GPT, P(dp=2, dp_kind="ddp"), 16, 1),
        ("fsdp gpt", _GPT, P(fsdp=2), 16, 1),
        ("tp gpt", _GPT, P(tp=2), 16, 1),
        ("1f1b gpt", _GPT, P(pp=2, schedule="1f1b"), 16, 4),
        ("ddp mlp", _MLP, P(dp=2, dp_kind="ddp"), 256, 1)],
    4: [("ddp gpt", _GPT, P(dp=4, dp_kind="ddp"), 16, 1),
        ("fsdp x tp gpt", _GPT, P(fsdp=2, tp=2), 16, 1),
        ("dp x pp gpt", _GPT, P(dp=2, pp=2, schedule="gpipe"), 16, 2)],
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
    load_by_rule: dict = field(default_factory=dict)  # {rule: load factor}
    rank_stretch: list = field(default_factory=list)  # per rank, over the timed steps

    @property
    def error(self) -> float:
        return (self.predicted_s - self.measured_s) / self.measured_s


def compare(cluster, runs=None, steps: int = 6, quick: bool = False,
            rule: str = "step") -> tuple[list, dict]:
    """Calibrate at each rank count, project each run, train it, and compare step times
    (the load applied by ``rule``, one of ``RULES``)."""
    import labkit

    runs = runs or RUNS
    out, calibrations = [], {}
    for n, cells in runs.items():
        with cluster.resized(n):
            calib = calibrate(cluster, repeats=3 if quick else 5)
            calibrations[n] = calib
            here = calib.cluster()
            for name, model, layout, batch, micro in cells:
                layout = parallelism(layout)
                predicted = project(model, layout, here, global_batch=batch,
                                    micro_batches=micro, precision="fp32")
                report = labkit.train(cluster, model=model, **layout.config_fields(),
                                      global_batch=batch, micro_batches=micro, steps=steps,
                                      estimate=False)
                stretches = step_stretches(report)
                rules = {r: load_factor(stretches, calib.core_share, r) for r in RULES}
                per_rank = [_stretch([s[r] for s in stretches]) for r in range(report.world_size)]
                factor = rules[rule]
                out.append(Comparison(name, n, str(layout), predicted.step_s * factor,
                                      steady_step_s(report), predicted.step_s, factor, rules,
                                      per_rank))
    return out, calibrations


RULES = ("step", "median", "slowest")


def steady_steps(report) -> list[int]:
    """The timed steps past the warm-up: their later half, at least 3 (all of them when
    there are no more). A step on CPU ranks keeps getting faster for about five steps after
    the first (measured: a classroom GPT's steps 181, 137, 113, 104, 96, 92, 91, 88 ms: the
    allocator and the caches settling), and the projection is of the steady step, the one a
    long run is made of."""
    timed = timed_steps(report.ranks)  # those TrainReport.split takes its median from
    keep = max(3, math.ceil(len(timed) / 2))
    return timed[-keep:]


def steady_step_s(report) -> float:
    """The median over ``steady_steps`` of the slowest rank's step (how
    ``TrainReport.median_step_s`` forms a step, over the later steps only)."""
    return statistics.median(max(r["records"][s]["step_s"] for r in report.ranks)
                             for s in steady_steps(report))


def step_stretches(report) -> list[list[tuple[float, float]]]:
    """Per steady step, per rank: (wall seconds, seconds waited for a core) since the
    previous step's end (``labkit.training.runqueue``); empty where the kernel gave none."""
    out = []
    for s in steady_steps(report):
        row = []
        for rank in report.ranks:
            now, before = rank["records"][s], rank["records"][s - 1] if s else None
            if before is None or "sched_wall_s" not in now or "sched_wall_s" not in before:
                return []
            row.append((now["sched_wall_s"] - before["sched_wall_s"],
                        now["sched_queued_s"] - before["sched_queued_s"]))
        out.append(row)
    return out


def _stretch(intervals) -> float:
    """wall / (wall - waited) over ``intervals`` of (wall, waited): 1 / the share of its
    runnable time a rank was on a core."""
    wall = sum(w for w, _ in intervals)
    waited = sum(q for _, q in intervals)
    return wall / (wall - waited) if wall > 0 and waited < wall else 1.0


def load_factor(stretches, core_share: float, rule: str = "step") -> float:
    """The load a run's timed steps ran under (``stretches`` from ``step_stretches``), less
    what ``core_share`` (the ranks' own sharing, already projected) explains; at least 1.
    ``rule``: see the module's docstring."""
    if not stretches:
        return 1.0
    if rule == "step":
        value = statistics.median(max(_stretch([x]) for x in row) for row in stretches)
    else:
        ranks = [_stretch([row[r] for row in stretches]) for r in range(len(stretches[0]))]
        value = statistics.median(ranks) if rule == "median" else max(ranks)
    return max(1.0, value / core_share)


def error_stats(comparisons) -> dict:
    errors = [abs(c.error) for c in comparisons]
    alone = [abs(c.predicted_alone_s - c.measured_s) / c.measured_s for c in comparisons
             if c.predicted_alone_s]
    return {"median_abs_error": statistics.median(errors), "worst_abs_error": max(errors),
            "runs": len(errors),
            "median_abs_error_alone": statistics.median(alone) if alone else None,
            "median_load_factor": statistics.median(c.load_factor for c in comparisons),
            "by_rule": _by_rule(comparisons)}


def _by_rule(comparisons) -> dict:
    """{rule: (median, worst) |error|} had the load been applied by that rule."""
    out = {}
    for rule in RULES:
        errors = [abs(c.predicted_alone_s * c.load_by_rule[rule] - c.measured_s) / c.measured_s
                  for c in comparisons if rule in c.load_by_rule]
        if errors:
            out[rule] = (statistics.median(errors), max(errors))
    return out


__all__ = ["RULES", "RUNS", "Calibration", "Comparison", "compare", "error_stats", "load_factor",
           "steady_step_s", "steady_steps", "step_stretches"]
