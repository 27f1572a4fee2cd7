"""The claims of notebook 06_recommender_at_scale, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson_fixture

SHARDED = ("table_wise", "row_wise")


nb = lesson_fixture("06_recommender_at_scale")


def test_the_tables_are_the_model(nb):
    parts = nb.results["parts"]
    assert parts["table_weights"] > 100 * parts["dense_weights"]


def test_one_device_runs_out_of_memory_with_a_margin(nb):
    results = nb.results
    assert results["single_oom"] is not None, "the tables were meant not to fit one device"
    assert results["parts"]["table_training"] >= 1.5 * results["capacity"]


def test_data_parallel_copies_hit_the_wall_where_the_single_device_did(nb):
    oom = nb.results["ddp_oom"]
    assert oom is not None, "DDP's full copies were meant not to fit"
    state = sum(oom["breakdown"][c] for c in ("parameters", "gradients", "optimizer"))
    assert state > 10 * oom["breakdown"]["activations"]  # the batch was never the problem
    assert oom["breakdown"]["parameters"] >= nb.results["parts"]["table_weights"]  # whole copy


def test_sgd_would_also_have_fitted_one_device(nb):
    parts, capacity = nb.results["parts"], nb.results["capacity"]
    weights = parts["table_weights"] + parts["dense_weights"]
    assert 2 * weights < 0.8 * capacity  # weights and gradients, no optimizer state


def test_the_planner_places_every_table_once_under_the_cap(nb):
    plan, capacity = nb.results["plan"], nb.results["capacity"]
    placed = sorted(t for ts in plan["tables_per_rank"] for t in ts) + plan["row_wise"]
    assert placed == sorted(range(len(plan["table_bytes"])))
    assert plan["fits"] and max(plan["total_bytes"]) <= capacity


def test_both_runs_fit_under_the_cap_that_stopped_the_single_device(nb):
    for name in SHARDED:
        assert max(nb.results["peaks"][name]) <= 0.95 * nb.results["capacity"], name


def test_the_tables_share_is_about_1_over_n_of_the_whole(nb):
    results = nb.results
    n, whole = results["world_size"], results["parts"]["table_training"]
    for name in SHARDED:
        tables = [rank["tables"] for rank in results["memory"][name]]
        assert sum(tables) == pytest.approx(whole, rel=0.01), name
        assert max(tables) < 1.3 * whole / n, name
    row_wise = [rank["tables"] for rank in results["memory"]["row_wise"]]
    assert max(row_wise) - min(row_wise) < 0.01 * whole  # even by construction


def test_splitting_the_model_does_not_change_what_it_learns(nb):
    losses = nb.results["losses"]
    for name in SHARDED:
        gap = max(abs(a - b) for a, b in zip(losses[name], losses["one_device"], strict=True))
        assert gap < 1e-5, name
    assert losses["one_device"][-1] < losses["one_device"][0]


def test_the_two_auc_curves_lie_on_top_of_each_other_and_rise(nb):
    (before_t, table), (before_r, row) = (nb.results["auc"][n] for n in SHARDED)
    assert before_t == pytest.approx(before_r, abs=1e-6)
    assert max(abs(a - b) for a, b in zip(table, row, strict=True)) < 1e-4
    assert table[-1] > before_t + 0.05  # it ranks clicks on samples it never saw


def test_row_wise_talks_in_more_calls_and_more_bytes_than_table_wise(nb):
    comm = nb.results["comm"]
    assert "all_to_all" in comm["table_wise"] and "reduce_scatter" in comm["row_wise"]
    calls, sent = ({name: sum(v[i] for v in comm[name].values()) for name in SHARDED}
                   for i in (0, 2))
    assert calls["row_wise"] > calls["table_wise"]
    assert sent["row_wise"] > sent["table_wise"]


def test_the_largest_part_of_one_devices_step_is_the_optimizers(nb):
    split = nb.results["speed"]["one device"]["split"]
    assert split["optimizer_s"] > max(split["lookup_s"], split["comm_s"], split["dense_s"])


def test_each_runs_step_splits_into_parts_that_add_up(nb):
    speed = nb.results["speed"]
    assert len(speed) == 3 and all(run["split"] is not None for run in speed.values())
    for name, run in speed.items():
        split = run["split"]
        parts = [split[k] for k in ("lookup_s", "comm_s", "optimizer_s", "dense_s")]
        assert min(parts) >= 0 and sum(parts) == pytest.approx(split["step_s"]), name
        assert run["samples_per_s"] > 0, name


def test_no_script_for_the_dlrm_and_the_refusal_says_why(nb):
    """"Take it to your GPUs": labkit.script refuses the table-wise run and the DDP baseline
    (both train the DLRM) and the printout names the tables as the reason."""
    scripts = nb.results["scripts"]
    assert set(scripts) == {"table-wise", f"DDP on {nb.results['world_size']}"}
    for reason in scripts.values():
        assert reason.startswith("refused: ") and "embedding tables" in reason, reason
    [cell] = nb.cells_with("labkit.script(")
    printed = "".join(o.get("text", "") for o in nb.cell(cell).outputs)
    assert printed.count("refused: ") == 2
