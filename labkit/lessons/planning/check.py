"""Check for notebook 09's exercise: the time of an AllReduce from alpha and beta.

The learner writes ``all_reduce_seconds(nbytes, ranks, alpha_s, bandwidth)``: a ring AllReduce
of a tensor of ``nbytes`` over ``ranks`` ranks, each link carrying ``bandwidth`` bytes/s and
each message of the ring costing ``alpha_s`` of latency. Every rank calls it for a grid of
cases (tiny to large messages, 1 to 1024 ranks, the links of this machine and of an H100
node), then cases drawn for each run from a fresh seed (each rank its own), and the check
compares each answer, in its own process, with the planner's own model
(``labkit.runtime.costs.collective_seconds``: 2(N-1) x alpha + 2(N-1)/N x bytes / bandwidth: the
ring sends 2(N-1) messages one after another, each paying alpha); on one rank nothing is sent, and
the time is 0. The ranks only return the numbers the learner's function gave: a table of the
fixed cases' answers fails on the drawn ones.
"""

from __future__ import annotations

import math
import random

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.costs import collective_seconds

EXERCISE = "all_reduce_seconds"
# (tensor bytes, ranks, alpha seconds, bandwidth bytes/s): this machine's gloo and H100 links
CASES = ((4096, 2, 300e-6, 1e9), (64 << 20, 2, 300e-6, 1e9), (64 << 20, 8, 10e-6, 450e9),
         (1 << 30, 1024, 20e-6, 50e9), (256, 8, 10e-6, 450e9), (1 << 20, 1, 300e-6, 1e9))
TOLERANCE = 1e-6  # relative: the same formula in other words passes
DRAWN = 4  # cases drawn per rank and run, after the fixed ones


def _expected(nbytes: int, ranks: int, alpha: float, bandwidth: float) -> float:
    return collective_seconds("all_reduce", nbytes, ranks, alpha, bandwidth)


def drawn_cases(seed: int) -> list[tuple]:
    """``DRAWN`` cases from ``seed``: 3 to 512 ranks with latency and bandwidth terms of the
    same order (so that leaving either out, or paying alpha once, is seen), and one rank."""
    pick = random.Random(seed)
    cases = []
    for _ in range(DRAWN - 1):
        ranks, alpha = pick.randint(3, 512), float(f"{pick.uniform(1e-6, 1e-3):.3g}")
        bandwidth = float(f"{pick.uniform(1e9, 1e12):.3g}")
        latency = 2 * (ranks - 1) * alpha  # the bytes' term is 0.2x to 5x this
        nbytes = round(pick.uniform(0.2, 5) * latency * bandwidth * ranks / (2 * (ranks - 1)))
        cases.append((max(nbytes, 1), ranks, alpha, bandwidth))
    return cases + [(pick.randint(1, 1 << 32), 1, float(f"{pick.uniform(1e-6, 1e-3):.3g}"), 1e9)]


def _job(ctx, fn, cases) -> list:
    return [fn(*case) for case in cases]


def _diagnose(case, got: float) -> str:
    nbytes, ranks, alpha, bandwidth = case
    want = _expected(*case)
    where = f"all_reduce_seconds({nbytes}, {ranks}, {alpha}, {bandwidth:.3g})"
    if ranks == 1:
        return f"{where} returned {got:.3g} s: one rank sends nothing, so the time is 0"
    share = 2 * (ranks - 1) / ranks
    if math.isclose(got, nbytes * share / bandwidth, rel_tol=1e-3):
        return f"{where} left out alpha: every message of the ring pays the latency alpha_s"
    if math.isclose(got, alpha + nbytes * share / bandwidth, rel_tol=1e-6):
        return (f"{where} paid alpha once: a ring AllReduce sends 2(N-1) messages one after "
                "another (N-1 to reduce-scatter, N-1 to all-gather), each paying alpha_s")
    if math.isclose(got, 2 * (ranks - 1) * alpha + nbytes / bandwidth, rel_tol=1e-3):
        return (f"{where} sent the whole tensor once: on a ring each rank sends 2(N-1)/N of "
                "it (reduce-scatter, then all-gather)")
    return (f"{where} returned {got:.6g} s; 2(N-1) x alpha + 2(N-1)/N x bytes / bandwidth is "
            f"{want:.6g} s")


def all_reduce_seconds(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Check ``fn(nbytes, ranks, alpha_s, bandwidth) -> seconds`` on every rank."""
    per_rank = [list(CASES) + drawn_cases(fresh_seed()) for _ in range(cluster.world_size)]
    outcome = run_checked(cluster, EXERCISE, "all_reduce_seconds", _job, fn,
                          PerRank(per_rank), timeout=timeout)  # rank r: its own cases only
    if outcome.verdict:
        return outcome.verdict
    for cases, values in zip(per_rank, outcome.values, strict=True):
        if not isinstance(values, list) or len(values) != len(cases):
            return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                          "write: its code on that rank changed the check's measurements")
        for case, got in zip(cases, values, strict=True):
            try:
                if isinstance(got, str | bytes | bool):
                    raise TypeError(type(got).__name__)  # float("1e-3") would take text
                got = float(got)
            except (TypeError, ValueError, OverflowError):
                return failed(EXERCISE, f"all_reduce_seconds{case} returned {got!r}: return "
                                        "seconds as a number")
            if not math.isclose(got, _expected(*case), rel_tol=TOLERANCE, abs_tol=1e-15):
                return failed(EXERCISE, _diagnose(case, got))
    return passed(EXERCISE, f"2(N-1) x alpha + 2(N-1)/N x bytes / bandwidth on {len(CASES)} "
                  f"cases, on every one of {cluster.world_size} ranks (and 0 on one rank).",
                  [f"and on {DRAWN} cases drawn for this run on each rank"],
                  cases=[list(c) for c in CASES])
