"""The claims of notebook 01_the_memory_wall, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import re

import pytest

from tests.lessons import lesson_fixture

GPU_BYTES = 80e9  # "one 80 GB GPU"


nb = lesson_fixture("01_the_memory_wall")


@pytest.fixture(scope="module")
def levers(nb):
    return {run["name"]: run for run in nb.results["levers"]}


@pytest.fixture(scope="module")
def maps(nb):
    """{lever: {world size: largest size predicted to fit}}, plain first."""
    out = {}
    for lever_map in nb.results["lever_boundaries"]:
        worlds = sorted({c["world_size"] for c in lever_map["cells"]})
        out[lever_map["lever"]] = {n: max((c["params"] for c in lever_map["cells"]
                                           if c["world_size"] == n and c["predicted_fits"]),
                                          default=0) for n in worlds}
    return out


def _largest_fitting(boundary: dict, world_size: int) -> int:
    return max((c["params"] for c in boundary["cells"]
                if c["world_size"] == world_size and c["fits"]), default=0)


def test_recorded_values(nb):
    results = nb.results
    measured = results["measured_peak"]
    assert measured <= results["capacity"]
    assert sum(v for k, v in results["at_peak"].items() if k != "total") == measured
    assert results["big_params"]["7B"] > 6e9  # a big, deep model (quiz 00's evidence)
    assert results["losses"][-1] < results["losses"][0]


def test_the_estimate_beside_every_measurement_matches_it(nb, levers):
    measured = nb.results["measured_peak"]
    assert abs(nb.results["estimated_peak"] - measured) < 0.1 * measured
    assert all(abs(run["estimated_bytes"] - run["peak_bytes"]) < 0.1 * run["peak_bytes"]
               for run in levers.values())  # the estimator traces every lever


def test_the_largest_size_runs_out_of_memory_and_the_error_says_what_was_in_use(nb):
    oom = nb.results["oom"]
    assert oom is not None, "the largest size was meant to run out of memory"
    assert oom["in_use"] + oom["requested"] > oom["capacity"] >= oom["in_use"]
    assert f"rank {oom['rank']}" in oom["message"] and "in use (parameters" in oom["message"]


def test_when_the_model_state_alone_is_more_than_the_device_the_error_says_so(nb):
    """The advice agrees with the note worked out before the run (no 'lower the batch size'
    beside 'the model state alone needs more than the capacity'), and the size it names as
    filling the capacity with model state alone is above what the map shows fitting, and
    said to be an upper bound."""
    message = nb.results["oom"]["message"]
    assert "Worked out before the run" in message and "whatever the batch size" in message
    assert "activations dominate" not in message and "lower the batch" not in message
    bound = float(re.search(r"fills the capacity at ~([\d.]+)M parameters", message)[1]) * 1e6
    assert bound > _largest_fitting(nb.results["boundary"], 1)
    assert "the largest model that trains is smaller than that" in message


def test_each_lever_is_trained_and_timed_here(levers):
    """The prose calls a few steps' times on a shared laptop noisy and claims no order (bf16
    measured 1.57x the plain step in one run under load, 0.52x in another: the plain run is
    the first on ranks restarted after the OOM cell); bench/levers.py times them properly."""
    assert list(levers) == ["plain", "checkpointing", "accumulation x4", "bf16", "mixed"]
    assert all(run["oom"] is None and run["step_s"] > 0 for run in levers.values())


def test_every_lever_shrinks_what_the_batch_costs(levers):
    plain = levers["plain"]
    for name, run in levers.items():
        if name != "plain":
            assert run["peak_bytes"] < plain["peak_bytes"], name
            assert run["category_peaks"]["activations"] < plain["category_peaks"]["activations"]


def test_the_model_state_alone_about_16_bytes_per_parameter_is_larger_than_the_gpu(nb):
    results = nb.results
    for name in ("7B", "70B"):
        assert 15.5 < results["state_per_param"][name] < 16.5, name
        assert results["state_per_param"][name] * results["big_params"][name] > GPU_BYTES
        assert results["big_models"][name] > GPU_BYTES


def test_a_model_a_few_times_larger_than_one_device_is_out_of_reach_of_all_of_them(nb):
    alternatives = nb.results["state_alternatives"]
    assert alternatives["7B"][0]["bytes"] > GPU_BYTES  # the reference does not fit...
    assert any(row["bytes"] <= GPU_BYTES for row in alternatives["7B"][1:])  # ...these do
    assert all(row["bytes"] > GPU_BYTES for row in alternatives["70B"])


def test_the_estimator_predicted_the_boundary_the_runs_found(nb):
    assert nb.results["boundary_agreement"] == 1.0
    fits = [c["fits"] for c in nb.results["boundary"]["cells"]]
    assert any(fits) and not all(fits)


def test_more_devices_move_the_ddp_boundary_a_little_then_it_stops_moving(nb):
    boundary = nb.results["boundary"]
    worlds = sorted({c["world_size"] for c in boundary["cells"]})
    largest = [_largest_fitting(boundary, n) for n in worlds]
    assert largest[1] > largest[0], largest
    assert largest[-1] == largest[-2], largest


def test_on_one_device_each_lever_fits_a_larger_model_than_plain_training(maps):
    plain = maps["plain"][1]
    assert len(maps) == 5, list(maps)  # plain and the four levers
    for lever, largest in maps.items():
        if lever != "plain":
            assert largest[1] > plain, (lever, largest, plain)


def test_bf16_moves_the_boundary_furthest_and_no_lever_fits_fewer(maps):
    for n, plain in maps["plain"].items():
        assert all(largest[n] >= plain for largest in maps.values()), n
        assert maps["bf16"][n] == max(largest[n] for largest in maps.values()), n
    assert any(maps["bf16"][n] > maps["plain"][n] for n in maps["plain"] if n > 1)


def test_with_more_devices_most_levers_gains_are_smaller_than_the_next_size(maps):
    others = [lever for lever in maps if lever != "plain"]
    for n, plain in maps["plain"].items():
        if n > 1:
            assert sum(maps[lever][n] == plain for lever in others) > len(others) / 2, n


def test_each_levers_boundary_is_confirmed_by_real_runs(nb):
    for lever_map in nb.results["lever_boundaries"][1:]:  # plain's cells are all trained
        trained = [c for c in lever_map["cells"] if c["measured_fits"] is not None]
        assert trained, lever_map["lever"]
        assert all(c["measured_fits"] == c["predicted_fits"] for c in trained), lever_map["lever"]
