"""Collectives timed over sizes, and the alpha-beta model fitted to them."""

from __future__ import annotations

import math

import pytest

import labkit
from labkit.runtime.comm import KINDS, fit_alpha_beta, time_collectives
from labkit.runtime.costs import ring_share

KIB = 1024


def test_the_fit_recovers_a_known_latency_and_bandwidth():
    alpha, bandwidth, n = 50e-6, 2e9, 4
    sizes = [2**k for k in range(12, 26, 2)]
    times = [alpha + ring_share("all_reduce", n) * b / bandwidth for b in sizes]
    fit = fit_alpha_beta("all_reduce", n, sizes, times)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-9)
    assert fit.bandwidth == pytest.approx(bandwidth, rel=1e-9)
    assert max(fit.relative_errors(sizes, times)) < 1e-9


def test_the_fit_never_gives_negative_latency_or_bandwidth():
    sizes = [1 << 20, 2 << 20, 4 << 20]
    pure_bandwidth = [b / 1e9 * 0.9 for b in sizes]  # a straight line through the origin, less
    fit = fit_alpha_beta("send", 2, sizes, pure_bandwidth)
    assert fit.alpha_s >= 0 and fit.bandwidth > 0
    flat = fit_alpha_beta("broadcast", 2, sizes, [1e-3, 1e-3, 1e-3])
    assert flat.alpha_s == pytest.approx(1e-3) and math.isinf(flat.bandwidth)


@pytest.mark.parametrize("bad", [{"sizes_bytes": [1024], "seconds": [1e-3]},
                                 {"sizes_bytes": [1024, 2048], "seconds": [1e-3, 0.0]},
                                 {"sizes_bytes": [1024, 1024], "seconds": [1e-3, 2e-3]}])
def test_the_fit_refuses_what_cannot_be_fitted(bad):
    with pytest.raises(ValueError):
        fit_alpha_beta("all_reduce", 2, **bad)


def test_sweeps_refuse_bad_requests_before_running(one):
    with pytest.raises(ValueError, match="two ranks"):
        time_collectives(one, ["all_reduce"], [1024])
    with pytest.raises(ValueError, match="unknown collectives"):
        time_collectives(one, ["all_reduce", "gossip"], [1024])


def test_the_fit_predicts_held_out_sizes_within_25_percent(two):
    """Every collective labkit teaches, timed at sizes 2x apart from 1 KiB (all latency) to
    1 MiB (mostly bandwidth), 150 interleaved rounds; each model is fitted on every other size
    (both ends included) and must predict each size in between, which it never saw, within
    25% of what was measured. 17-21 s on a 2-core machine loaded by other test runs (load
    20-38: worst held-out error 9.5-13% in 5 runs out of 5; with 100 rounds one run in six
    reached 27% at load 17)."""
    sizes = [KIB << k for k in range(11)]
    fitted, held_out = sizes[::2], sizes[1::2]
    sweep = time_collectives(two, KINDS, sizes, repeats=150)
    assert set(sweep.timings) == set(KINDS)
    errors = {}
    for kind, timings in sweep.timings.items():
        assert len(timings.seconds) == len(sizes) and min(timings.seconds) > 0, kind
        measured = dict(zip(timings.sizes_bytes, timings.seconds, strict=True))
        fit = sweep.fit(kind, fitted)
        assert fit.alpha_s >= 0 and 1e6 < fit.bandwidth < 1e13, fit
        assert fit.predict(sizes[-1]) > fit.predict(sizes[0]), fit
        errors[kind] = fit.relative_errors(held_out, [measured[s] for s in held_out])
    worst = max(max(e) for e in errors.values())
    print(f"worst held-out error {worst:.1%}")  # shown with pytest -s
    assert worst <= 0.25, {k: [f"{x:.0%}" for x in e] for k, e in errors.items()}


def test_time_all_reduce_keeps_its_bus_bandwidth(two):
    timings = labkit.time_all_reduce(two, [256 * KIB, 1024 * KIB], repeats=3)
    row = timings.rows[-1]
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2)
    assert timings.fit().kind == "all_reduce"


def test_one_collective_named_as_a_string_is_that_collective(one):
    # list("all_reduce") is ten letters: the error named 'a', 'l', ... as unknown collectives
    with pytest.raises(ValueError, match="two ranks"):
        time_collectives(one, "all_reduce", [1024])
