"""Notebook 09's exercise check, both ways: the course's reference passes; planted wrong
answers fail with the message that names their mistake."""

from __future__ import annotations

import sys

import cloudpickle
import pytest

import labkit
from tests.exercises import solution

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # planted code goes by value


def no_alpha(nbytes, ranks, alpha_s, bandwidth):
    return 0.0 if ranks == 1 else 2 * (ranks - 1) / ranks * nbytes / bandwidth


def whole_tensor(nbytes, ranks, alpha_s, bandwidth):
    return 0.0 if ranks == 1 else 2 * (ranks - 1) * alpha_s + nbytes / bandwidth


def alpha_once(nbytes, ranks, alpha_s, bandwidth):
    """The latency paid once per collective, not once per ring step (the old model's slip)."""
    return 0.0 if ranks == 1 else alpha_s + 2 * (ranks - 1) / ranks * nbytes / bandwidth


def alpha_on_one_rank(nbytes, ranks, alpha_s, bandwidth):
    return max(2 * (ranks - 1), 1) * alpha_s + 2 * (ranks - 1) / ranks * nbytes / bandwidth


@pytest.fixture(scope="module")
def two():
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        yield cluster


def test_all_reduce_seconds_both_ways(two):
    reference = solution("09_plan_a_real_run", "all_reduce_seconds_answer",
                         "all_reduce_seconds")
    assert labkit.check.all_reduce_seconds(two, reference).passed
    for planted, message in ((no_alpha, "left out alpha"),
                             (whole_tensor, "2(N-1)/N"),
                             (alpha_once, "paid alpha once"),
                             (alpha_on_one_rank, "one rank sends nothing")):
        found = labkit.check.all_reduce_seconds(two, planted)
        assert found.status == "failed" and message in found.summary, str(found)
