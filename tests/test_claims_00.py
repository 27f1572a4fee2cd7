"""The claims of notebook 00_your_cluster, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("00_your_cluster")


def test_recorded_values(nb):
    results = nb.results
    n = results["world_size"]
    expected = float(sum(range(n)))
    assert results["totals"] == [expected] * n
    assert results["totals_after_failure"] == [expected] * n
    assert results["failed_rank"] == 1
    rows = results["all_reduce"]
    assert [r["bytes"] for r in rows] == sorted(r["bytes"] for r in rows)
    assert all(r["seconds"] > 0 and r["busbw_GBps"] > 0 for r in rows)
