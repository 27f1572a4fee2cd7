"""The claims of notebook 04_tensor_parallel, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("04_tensor_parallel")


def test_recorded_values(nb):
    results = nb.results
    assert results["split_errors"] == {"column": 0.0, "row": 0.0}
    assert results["single_oom"], "the model was meant not to fit one device"
    assert max(results["tp_peaks"]) <= results["capacity"]  # but it fits split
    losses = results["losses"]
    assert all(abs(a - b) < 1e-4 * abs(b) for a, b in zip(losses["tp"], losses["reference"],
                                                           strict=True))
    n, params = results["world_size"], results["parameters"]
    assert all(p < 1.1 * params["reference"] / n for p in params["tp"])  # about 1/N each
    pairs = results["n_layers"] // 2  # forward: one AllReduce per pair; backward: all but 1st
    rows = results["per_layer"]
    assert sum(r["calls"] for r in rows if r["phase"] == "forward") == pairs
    assert sum(r["calls"] for r in rows if r["phase"] == "backward") == pairs - 1
    assert all(r["bytes"] == 4 * r["shape"][0] * r["shape"][1] for r in rows)
    total, n = sum(r["bytes"] for r in rows), results["world_size"]
    assert results["step_comm"] == {"all_reduce": [2 * pairs - 1, total,
                                                   pytest.approx(2 * (n - 1) / n * total)]}
    tp = [r for r in results["versus"] if r["strategy"] == "tp"]
    ddp = [r for r in results["versus"] if r["strategy"] == "ddp"]
    assert all(r["bytes"] * tp[0]["batch"] == tp[0]["bytes"] * r["batch"] for r in tp)
    assert len({r["bytes"] for r in ddp}) == 1
    assert tp[0]["bytes"] < ddp[0]["bytes"] and tp[-1]["bytes"] > ddp[-1]["bytes"]
    assert tp[0]["batch"] < results["crossover"] < tp[-1]["batch"]
