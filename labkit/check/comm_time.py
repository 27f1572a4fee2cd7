"""Check for notebook 09's exercise: the time of an AllReduce from alpha and beta.

The learner writes ``all_reduce_seconds(nbytes, ranks, alpha_s, bandwidth)``: a ring AllReduce
of a tensor of ``nbytes`` over ``ranks`` ranks, each link carrying ``bandwidth`` bytes/s and
each collective costing ``alpha_s`` to start. Every rank calls it for a grid of cases (tiny to
large messages, 1 to 1024 ranks, the links of this machine and of an H100 node), and the check
compares each answer with the planner's own model (``labkit.comm.AlphaBeta.predict``: alpha +
2(N-1)/N x bytes / bandwidth); on one rank nothing is sent, and the time is 0.
"""

from __future__ import annotations

import math

from labkit.check.result import CheckResult, failed, passed
from labkit.check.runner import run_checked
from labkit.comm.alpha_beta import AlphaBeta

EXERCISE = "all_reduce_seconds"
# (tensor bytes, ranks, alpha seconds, bandwidth bytes/s): this machine's gloo and H100 links
CASES = ((4096, 2, 300e-6, 1e9), (64 << 20, 2, 300e-6, 1e9), (64 << 20, 8, 10e-6, 450e9),
         (1 << 30, 1024, 20e-6, 50e9), (256, 8, 10e-6, 450e9), (1 << 20, 1, 300e-6, 1e9))
TOLERANCE = 1e-6  # relative: the same formula in other words passes


def _expected(nbytes: int, ranks: int, alpha: float, bandwidth: float) -> float:
    if ranks == 1:
        return 0.0
    return AlphaBeta("all_reduce", ranks, alpha, bandwidth).predict(nbytes)


def _job(ctx, fn) -> list:
    return [fn(*case) for case in CASES]


def _diagnose(case, got: float) -> str:
    nbytes, ranks, alpha, bandwidth = case
    want = _expected(*case)
    where = f"all_reduce_seconds({nbytes}, {ranks}, {alpha}, {bandwidth:.3g})"
    if ranks == 1:
        return f"{where} returned {got:.3g} s: one rank sends nothing, so the time is 0"
    share = 2 * (ranks - 1) / ranks
    if math.isclose(got, nbytes * share / bandwidth, rel_tol=1e-3):
        return f"{where} left out alpha: every collective pays its start-up cost alpha_s once"
    if math.isclose(got, alpha + nbytes / bandwidth, rel_tol=1e-3):
        return (f"{where} sent the whole tensor once: on a ring each rank sends 2(N-1)/N of "
                "it (reduce-scatter, then all-gather)")
    return f"{where} returned {got:.6g} s; alpha + 2(N-1)/N x bytes / bandwidth is {want:.6g} s"


def all_reduce_seconds(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Check ``fn(nbytes, ranks, alpha_s, bandwidth) -> seconds`` on every rank."""
    outcome = run_checked(cluster, EXERCISE, "all_reduce_seconds", _job, fn, timeout=timeout)
    if outcome.verdict:
        return outcome.verdict
    for values in outcome.values:
        for case, got in zip(CASES, values, strict=True):
            try:
                got = float(got)
            except (TypeError, ValueError):
                return failed(EXERCISE, f"all_reduce_seconds{case} returned {got!r}: return "
                                        "seconds as a number")
            if not math.isclose(got, _expected(*case), rel_tol=TOLERANCE, abs_tol=1e-15):
                return failed(EXERCISE, _diagnose(case, got))
    return passed(EXERCISE, f"alpha + 2(N-1)/N x bytes / bandwidth on {len(CASES)} cases, on "
                  f"every one of {cluster.world_size} ranks (and 0 on one rank).",
                  cases=[list(c) for c in CASES])
