"""The claims of notebook 05_sharded_data_parallel, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("05_sharded_data_parallel")


def test_recorded_values(nb):
    results = nb.results
    rows = {(r["strategy"], r["world_size"]): r for r in results["rows"]}
    assert all(r["estimate_error"] < 0.10 for r in rows.values())  # estimator within 10%
    n = max(results["world_sizes"])
    peak = {s: rows[s, n]["peak_bytes"] for s in ("ddp", "zero1", "fsdp")}
    assert peak["fsdp"] < peak["zero1"] < peak["ddp"]
    assert peak["ddp"] > 0.95 * rows["ddp", 1]["peak_bytes"]  # DDP: a full copy per rank
    assert all(gap < 1e-4 for gap in results["loss_gaps"].values())
    kinds = {s: rows[s, n]["comm_kinds"] for s in ("ddp", "zero1", "fsdp")}
    gradients = kinds["ddp"]["all_reduce"][1]
    assert kinds["fsdp"]["reduce_scatter"][1] == gradients
    assert kinds["zero1"]["broadcast"][1] >= gradients
    wire = {s: rows[s, n]["comm_wire_bytes"] for s in ("ddp", "zero1", "fsdp")}
    assert wire["fsdp"] == pytest.approx(1.5 * wire["ddp"], rel=0.02)  # three passes vs two
    assert wire["zero1"] == pytest.approx(1.5 * wire["ddp"], rel=0.02)
    fit = results["largest_fitting"]
    assert (fit["fsdp"] or 0) >= (fit["zero1"] or 0) >= (fit["ddp"] or 0)
    assert (fit["fsdp"] or 0) > (fit["ddp"] or 0), "the boundary was meant to move"
    assert all(a >= 0.8 for a in results["agreement"].values())
    per_param = results["bytes_per_param"]  # the runs are fp32 Adam: 4 + 4 + 8 (+ temporaries)
    assert per_param["parameters"] == per_param["gradients"] == 4.0
    assert 8.0 <= per_param["optimizer"] < 12.0  # Adam's two moments, and its step's temporaries
