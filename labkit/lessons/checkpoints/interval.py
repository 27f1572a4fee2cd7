"""How often to checkpoint: time lost to saving against time lost to recomputing.

A run saves every ``interval`` seconds of work, each save costing ``save_s`` (C). Failures
come at random, a mean time ``mtbf_s`` (M) apart (exponentially distributed, as a constant
failure rate gives). A failure loses everything done since the last save, plus
``restart_s`` to start again. Saving often wastes time saving; saving rarely wastes time
recomputing. Young (1974) and Daly (2006): to first order the fraction of time lost is
``C / interval + interval / (2 M)``, smallest at ``interval = sqrt(2 C M)``.

``simulate`` plays a long run out failure by failure (pure Python, no torch) with the save
cost and step time a learner measured; ``expected_overhead`` is Daly's exact expectation for
exponential failures, which the simulation converges to; tests check both.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

# "The Llama 3 Herd of Models" (Llama Team, AI @ Meta, 2024, arXiv:2407.21783, section 3.3.4
# "Reliability and operational challenges"): a 54-day snapshot of pre-training on up to
# 16,384 H100 GPUs saw 466 job interruptions, 419 of them unexpected.
LLAMA3 = {"days": 54, "gpus": 16384, "interruptions": 466, "unexpected": 419,
          "source": "The Llama 3 Herd of Models, arXiv:2407.21783, section 3.3.4"}


def llama3_mtbf_hours() -> tuple[float, float]:
    """(the job's mean time between unexpected interruptions, one GPU's) in hours, from
    ``LLAMA3`` (every interruption charged to one GPU)."""
    job = LLAMA3["days"] * 24 / LLAMA3["unexpected"]
    return job, job * LLAMA3["gpus"]


def cluster_mtbf(gpu_mtbf_s: float, gpus: int) -> float:
    """A job on ``gpus`` GPUs stops when any one fails: its MTBF is one GPU's over ``gpus``."""
    if gpu_mtbf_s <= 0 or gpus < 1:
        raise ValueError(f"need gpu_mtbf_s > 0 and gpus >= 1, got {gpu_mtbf_s}, {gpus}")
    return gpu_mtbf_s / gpus


def young_daly(save_s: float, mtbf_s: float) -> float:
    """The first-order optimal interval between saves, sqrt(2 C M), in seconds of work."""
    _check(save_s=save_s, mtbf_s=mtbf_s)
    return math.sqrt(2 * save_s * mtbf_s)


def first_order_overhead(interval_s: float, save_s: float, mtbf_s: float) -> float:
    """Young's approximation of the time lost per unit of work: C/interval + interval/2M."""
    _check(interval_s=interval_s, mtbf_s=mtbf_s)
    return save_s / interval_s + interval_s / (2 * mtbf_s)


def expected_overhead(interval_s: float, save_s: float, mtbf_s: float,
                      restart_s: float = 0.0) -> float:
    """Daly's exact expected time lost per unit of work, exponential failures: a segment of
    ``interval_s`` work plus a save takes M e^(R/M) (e^((interval + C)/M) - 1) on average."""
    _check(interval_s=interval_s, mtbf_s=mtbf_s)
    segment = mtbf_s * math.exp(restart_s / mtbf_s) * math.expm1((interval_s + save_s) / mtbf_s)
    return segment / interval_s - 1


@dataclass(frozen=True)
class Simulated:
    """One simulated run: its work, and where the rest of its wall time went (seconds)."""

    work_s: float
    saving_s: float  # saves that completed
    recompute_s: float  # work and saves lost to failures, and restarts
    failures: int

    @property
    def overhead(self) -> float:
        """Time lost per unit of work (0.1: the run took 10% longer than its work)."""
        return (self.saving_s + self.recompute_s) / self.work_s


def simulate(interval_s: float, save_s: float, mtbf_s: float, work_s: float,
             restart_s: float = 0.0, seed: int = 0) -> Simulated:
    """Play a run of ``work_s`` seconds of work out, saving after every ``interval_s`` of
    work (and at the end), with failures drawn at rate 1/``mtbf_s``."""
    _check(interval_s=interval_s, mtbf_s=mtbf_s, work_s=work_s)
    rng = random.Random(seed)
    done = saving = lost = 0.0
    failures = 0
    until_failure = rng.expovariate(1 / mtbf_s)
    while done < work_s:
        whole = math.floor((work_s - done) / interval_s)  # full segments left
        k = min(whole, math.floor(until_failure / (interval_s + save_s)))
        if k:  # k segments (work, then its save) end before the next failure
            until_failure -= k * (interval_s + save_s)
            done += k * interval_s
            saving += k * save_s
            continue
        work = min(interval_s, work_s - done)
        if work <= 1e-12 * work_s:
            break
        segment = work + save_s
        if until_failure >= segment:  # the last, shorter segment
            until_failure -= segment
            done += work
            saving += save_s
            continue
        lost += until_failure  # back to the last save
        failures += 1
        until_failure = rng.expovariate(1 / mtbf_s)
        while until_failure < restart_s:  # a restart can fail too
            lost += until_failure
            failures += 1
            until_failure = rng.expovariate(1 / mtbf_s)
        until_failure -= restart_s
        lost += restart_s
    return Simulated(work_s, saving, lost, failures)


def interval_steps(save_s: float, step_s: float, mtbf_s: float) -> int:
    """Young/Daly's interval as a whole number of training steps (at least 1)."""
    _check(step_s=step_s)
    return max(1, round(young_daly(save_s, mtbf_s) / step_s))


def _check(**values: float) -> None:
    for name, value in values.items():
        if not (isinstance(value, (int, float)) and value > 0) and name != "save_s":
            raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if name == "save_s" and not (isinstance(value, (int, float)) and value >= 0):
            raise ValueError(f"save_s must be >= 0 seconds, got {value!r}")
