"""The claims of notebook 09_plan_a_real_run, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("09_plan_a_real_run")


def test_recorded_values(nb):
    results = nb.results
    comparisons = results["comparisons"]
    assert {c["ranks"] for c in comparisons} == {1, results["world_size"]}
    assert all(c["projected_s"] > 0 and c["measured_s"] > 0 for c in comparisons)
    assert results["error"]["runs"] == len(comparisons)  # the error stats cover every run
    for n, calibration in results["calibration"].items():  # measured, never assumed
        assert calibration["matmul_flops"] > 0 and calibration["op_overhead_s"] > 0
        assert bool(calibration["links"]) == (int(n) > 1)
    days = results["recommender_days"]  # more GPUs, placed by the planner: fewer days
    assert days["8 x A100 (1 node)"] < days["1 x RTX 4090"]
    for name, row in results["decoders"].items():
        assert row["fits"] and 0 < row["mfu"] < 0.5, name
        assert row["links"].get("tp", "in-node") == "in-node", name  # tp never crosses nodes
    assert results["check"]["status"] == "passed"
