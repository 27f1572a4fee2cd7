"""labkit/lessons/checkpoints/interval.py: the simulated time lost against the closed forms."""

from __future__ import annotations

import math

import pytest

from labkit.lessons.checkpoints import interval


def test_young_daly_is_the_minimum_of_the_first_order_overhead():
    save, mtbf = 30.0, 3 * 3600.0
    best = interval.young_daly(save, mtbf)
    assert best == pytest.approx(math.sqrt(2 * 30 * 3 * 3600))
    at_best = interval.first_order_overhead(best, save, mtbf)
    assert at_best == pytest.approx(math.sqrt(2 * save / mtbf))  # 2C/tau at the optimum
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert interval.first_order_overhead(best * factor, save, mtbf) > at_best


@pytest.mark.parametrize("tau, save, mtbf, restart", [
    (300.0, 30.0, 3600.0, 0.0), (60.0, 5.0, 1800.0, 0.0), (900.0, 60.0, 3600.0, 120.0)])
def test_simulation_converges_to_dalys_exact_expectation(tau, save, mtbf, restart):
    run = interval.simulate(tau, save, mtbf, work_s=3000 * mtbf, restart_s=restart, seed=1)
    exact = interval.expected_overhead(tau, save, mtbf, restart)
    assert run.failures > 2000  # many failures: the mean is close to its expectation
    assert run.overhead == pytest.approx(exact, rel=0.03)
    assert run.saving_s == pytest.approx(save * 3000 * mtbf / tau)  # every completed save


def test_the_simulated_best_interval_is_young_dalys():
    save, mtbf = 10.0, 3600.0
    grid = [interval.young_daly(save, mtbf) * f for f in (0.25, 0.5, 1.0, 2.0, 4.0)]
    lost = [interval.simulate(t, save, mtbf, work_s=2000 * mtbf, seed=2).overhead
            for t in grid]
    assert min(range(len(grid)), key=lost.__getitem__) == 2
    # With C << M the first-order form is close to the exact one near the optimum.
    assert interval.first_order_overhead(grid[2], save, mtbf) == pytest.approx(
        interval.expected_overhead(grid[2], save, mtbf), rel=0.1)


def test_helpers_and_bad_input():
    job, gpu = interval.llama3_mtbf_hours()
    assert job == pytest.approx(54 * 24 / 419)  # about 3.1 hours
    assert gpu == pytest.approx(job * 16384)
    assert interval.cluster_mtbf(1000.0, 8) == 125.0
    assert interval.interval_steps(save_s=2.0, step_s=0.5, mtbf_s=900.0) == 120
    assert interval.interval_steps(save_s=0.0, step_s=1.0, mtbf_s=900.0) == 1
    with pytest.raises(ValueError, match="mtbf_s must be a positive"):
        interval.young_daly(1.0, 0)
    with pytest.raises(ValueError, match="save_s must be >= 0"):
        interval.young_daly(-1.0, 10.0)
    with pytest.raises(ValueError, match="gpus >= 1"):
        interval.cluster_mtbf(10.0, 0)
