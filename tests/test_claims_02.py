"""The claims of notebook 02_data_parallel, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("02_data_parallel")


def test_recorded_values(nb):
    results = nb.results
    gaps = results["parity_gap"]
    assert len(gaps) == 4 and all(gap < 1e-4 for gap in gaps.values())  # same training
    for name, split in results["split"].items():
        assert abs(split["compute_s"] + split["comm_s"] - split["step_s"]) < 1e-9, name
    n = results["world_size"]
    assert results["strong"]["1"] == 1.0 and results["weak"]["1"] == 1.0
    assert results["strong"][str(n)] > 0 and results["bus_bandwidth"] > 0
    comm = results["comm"][str(n)]
    assert comm["bytes"] > 0 and comm["predicted_s"] > 0 and comm["measured_busy_s"] > 0
    # the runs the quizzes point to (evidence:... cells)
    assert results["held_out"]["gap"] < 1e-5  # N devices generalise exactly as one
    ends = results["endpoints"]["held_out_losses"]
    assert len(set(ends)) == len(ends) == n  # different starts, different ends
    turns = results["turns"]
    assert turns["utilisation"]["turns"] <= 1 / n + 0.05  # each device busy ~1/N of a step
    work = results["work"]
    assert sum(work["flops"]) == work["whole_flops"] and work["flops_per_s"] > 0
    whole, accumulated = results["accumulation_activations"].values()
    assert accumulated < whole  # accumulation saves activation memory, not time
    timeline = results["bucket_timeline"]  # the overlap plot's buckets are DDP's
    assert len(timeline["buckets"]) == timeline["ddp_buckets"] > 1
    assert all(0 <= b["issued"] <= b["done"] for b in timeline["buckets"])
    fit = results["ring_fit"]  # the ring formula's terms come from other sizes than it predicts
    assert fit["held_out_bytes"] not in fit["sizes_bytes"] and len(fit["sizes_bytes"]) >= 2
    assert fit["bandwidth"] > 0 and fit["predicted_s"] > 0 and fit["held_out_s"] > 0
    assert results["bus_bandwidth"] == fit["bandwidth"]
