"""The claims of notebook 07_putting_it_together, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("07_putting_it_together")


def test_recorded_values(nb):
    results = nb.results
    runs, capacity = results["runs"], results["capacity"]
    assert "oom" in runs["one device"], "the model was meant not to fit one device"
    assert "oom" in runs["data parallel alone"], "DDP's full copies were meant not to fit"
    for name in ("model parallel alone", "both"):  # splitting the layers makes it fit
        run = runs[name]
        assert "oom" not in run, name
        assert max(run["peaks"]) <= capacity and run["samples_per_s"] > 0
        assert run["estimate_error"] < 0.10  # the estimator traces composed layouts too
    both = runs["both"]
    assert set(both["comm_by_dim"]) == {"dp", "tp"}  # each collective filed under its group
    assert results["loss_gap"] < 1e-4  # the composed run trains as one device
    assert results["dim_bytes"]["dp"] > 0 and results["dim_bytes"]["tp"] > 0
    n = results["world_size"]
    assert results["groups"] == [[r, r + 1] for r in range(0, n, 2)]  # tp: neighbours
    assert results["check"]["status"] == "passed"
