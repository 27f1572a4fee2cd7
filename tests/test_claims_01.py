"""The claims of notebook 01_the_memory_wall, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("01_the_memory_wall")


def test_recorded_values(nb):
    results = nb.results
    measured = results["measured_peak"]
    assert abs(results["estimated_peak"] - measured) < 0.1 * measured
    assert measured <= results["capacity"]
    assert sum(v for k, v in results["at_peak"].items() if k != "total") == measured
    oom = results["oom"]
    assert oom is not None, "the largest size was meant to run out of memory"
    assert oom["in_use"] + oom["requested"] > oom["capacity"] >= oom["in_use"]
    assert results["big_models"]["7B"] > 80e9  # does not fit one 80 GB GPU
    assert results["big_params"]["7B"] > 6e9  # a big, deep model (quiz 00's evidence)
    assert 15.5 < results["state_per_param"]["7B"] < 16.5  # "about 16 bytes per parameter"
    levers = {run["name"]: run for run in results["levers"]}
    assert all(run["oom"] is None and run["step_s"] > 0 for run in levers.values())
    assert all(abs(run["estimated_bytes"] - run["peak_bytes"]) < 0.1 * run["peak_bytes"]
               for run in levers.values())  # the estimator traces every lever
    plain = levers["plain"]["category_peaks"]["activations"]
    for name in ("checkpointing", "accumulation x4", "bf16"):  # each saves activation memory
        assert levers[name]["category_peaks"]["activations"] < plain, name
    assert results["boundary_agreement"] >= 0.8
    fits = [c["fits"] for c in results["boundary"]["cells"]]
    assert any(fits) and not all(fits)
    assert results["losses"][-1] < results["losses"][0]
    maps = {m["lever"]: m["cells"] for m in results["lever_boundaries"]}  # plain first
    assert list(maps)[0] == "plain" and len(maps) >= 2
    for lever, cells in list(maps.items())[1:]:  # plain's cells are the boundary's above
        trained = [c for c in cells if c["measured_fits"] is not None]
        assert trained, lever  # each lever's boundary is confirmed by real runs
        assert all(c["measured_fits"] == c["predicted_fits"] for c in trained), lever
        assert sum(c["predicted_fits"] for c in cells) >= sum(fits), lever  # never fewer
