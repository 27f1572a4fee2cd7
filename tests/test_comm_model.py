"""Collectives timed over sizes, and the alpha-beta model fitted to them."""

from __future__ import annotations

import math

import pytest

import labkit
from labkit.comm import KINDS, fit_alpha_beta, time_collectives
from labkit.costs import ring_share

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


def test_every_collective_is_timed_and_its_fit_grows_with_size(two):
    """Every collective is timed at every size, and its fitted model is a real latency plus
    a real bandwidth. How well it predicts held-out sizes is a speed claim, measured side by
    side in a bench, not here: on a shared 2-core machine one size can take 4x its
    neighbour."""
    sizes = [256 * KIB, 1024 * KIB, 4096 * KIB]
    sweep = time_collectives(two, KINDS, sizes, repeats=5)
    assert set(sweep.timings) == set(KINDS)
    for kind, timings in sweep.timings.items():
        assert len(timings.seconds) == len(sizes) and min(timings.seconds) > 0, kind
        fit = sweep.fit(kind, sizes)
        assert fit.alpha_s >= 0 and 1e6 < fit.bandwidth < 1e13, fit
        assert fit.predict(sizes[-1]) > fit.predict(sizes[0]), fit


def test_time_all_reduce_keeps_its_bus_bandwidth(two):
    timings = labkit.time_all_reduce(two, [256 * KIB, 1024 * KIB], repeats=3)
    row = timings.rows[-1]
    assert row["busbw_GBps"] == pytest.approx(row["algbw_GBps"] * 2 * (2 - 1) / 2)
    assert timings.fit().kind == "all_reduce"
