"""The claims of notebook 06_recommender_at_scale, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("06_recommender_at_scale")


def test_recorded_values(nb):
    results = nb.results
    n, capacity, parts = results["world_size"], results["capacity"], results["parts"]
    assert parts["table_weights"] > 10 * parts["dense_weights"]  # tables are the model
    for name in ("single_oom", "ddp_oom"):  # one device, and DDP's full copies, do not fit
        oom = results[name]
        assert oom is not None, f"{name}: the tables were meant not to fit one device"
        state = sum(oom["breakdown"][c] for c in ("parameters", "gradients", "optimizer"))
        assert state > oom["breakdown"]["activations"]
    plan = results["plan"]
    assert sorted(t for ts in plan["tables_per_rank"] for t in ts) + plan["row_wise"] == sorted(
        range(len(plan["table_bytes"])))
    assert plan["fits"] and max(plan["total_bytes"]) <= capacity
    for name in ("table_wise", "row_wise"):
        assert max(results["peaks"][name]) <= capacity  # sharded, the same tables fit
        tables = [rank["tables"] for rank in results["memory"][name]]
        assert abs(sum(tables) - parts["table_training"]) < 0.01 * parts["table_training"]
        assert max(tables) < 1.3 * parts["table_training"] / n  # about 1/N per rank
        before, after = results["auc"][name]
        assert after[-1] > before + 0.05  # it learns, on samples it never saw
        losses = results["losses"][name]
        assert losses[-1] < losses[0]
    assert all(abs(a - b) < 1e-5 for a, b in zip(results["losses"]["table_wise"],
                                                  results["losses"]["row_wise"], strict=True))
    assert all(abs(a - b) < 1e-5 for a, b in zip(results["losses"]["table_wise"],
                                                  results["losses"]["one_device"], strict=True))
    assert "all_to_all" in results["comm"]["table_wise"]
    assert "reduce_scatter" in results["comm"]["row_wise"]
    for name, run in results["speed"].items():
        assert run["samples_per_s"] > 0, name
        if run["split"] is not None:
            split = run["split"]
            assert min(split["lookup_s"], split["comm_s"], split["dense_s"]) >= 0
            assert abs(split["lookup_s"] + split["comm_s"] + split["dense_s"]
                       - split["step_s"]) < 1e-9
