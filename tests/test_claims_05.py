"""The claims of notebook 05_sharded_data_parallel, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import COURSE, lesson_fixture

STRATEGIES = ("ddp", "zero1", "fsdp")


nb = lesson_fixture("05_sharded_data_parallel")


@pytest.fixture(scope="module")
def rows(nb):
    return {(r["strategy"], r["world_size"]): r for r in nb.results["rows"]}


def _ends(nb):
    return min(nb.results["world_sizes"]), max(nb.results["world_sizes"])


def test_the_black_tick_is_what_the_estimator_predicted(rows):
    assert all(r["estimate_error"] < 0.10 for r in rows.values())  # within 10% of the run


def test_ddp_stays_the_same_height_on_every_device_count(nb, rows):
    low, high = _ends(nb)
    assert high > low, "the comparison needs two device counts"
    assert rows["ddp", high]["peak_bytes"] > 0.95 * rows["ddp", low]["peak_bytes"]


def test_zero1_loses_optimizer_state_as_devices_are_added_the_rest_stays(nb, rows):
    low, high = _ends(nb)
    few, many = rows["zero1", low]["at_peak"], rows["zero1", high]["at_peak"]
    assert many["optimizer"] < 0.75 * few["optimizer"]
    for part in ("parameters", "gradients"):
        assert many[part] == few[part], part


def test_fsdp_loses_parameters_gradients_and_optimizer_state_together(nb, rows):
    low, high = _ends(nb)
    few, many = rows["fsdp", low]["at_peak"], rows["fsdp", high]["at_peak"]
    for part in ("parameters", "gradients", "optimizer"):
        assert many[part] < 0.75 * few[part], part
    peak = {s: rows[s, high]["peak_bytes"] for s in STRATEGIES}
    assert peak["fsdp"] < peak["zero1"] < peak["ddp"]


def test_sharding_changes_where_the_state_lives_not_what_is_computed(nb):
    assert all(gap < 1e-4 for gap in nb.results["loss_gaps"].values())


def test_bytes_per_parameter_measured_beside_the_fp32_row(nb):
    per_param = nb.results["bytes_per_param"]  # fp32 Adam: 4 + 4 + 8 (+ its temporaries)
    assert per_param["parameters"] == per_param["gradients"] == 4.0
    assert 8.0 <= per_param["optimizer"] < 12.0


def test_zero1_and_fsdp_send_1_5_times_ddps_traffic(nb, rows):
    high = _ends(nb)[1]
    assert nb.results["wire_ratio"] == pytest.approx({"zero1": 1.5, "fsdp": 1.5}, rel=0.02)
    kinds = {s: rows[s, high]["comm_kinds"] for s in STRATEGIES}
    gradients = kinds["ddp"]["all_reduce"][1]
    assert kinds["fsdp"]["reduce_scatter"][1] == gradients  # FSDP: reduce-scatter the grads
    assert kinds["zero1"]["broadcast"][1] >= gradients      # ZeRO-1: the same AllReduce + ...


def test_for_ddp_the_boundary_is_flat(nb):
    ddp = nb.results["boundary"]["ddp"]
    assert len(set(ddp.values())) == 1 and min(ddp.values()) > 0


def test_zero1s_boundary_climbs_from_one_device_to_two_then_stays_flat(nb):
    zero1 = nb.results["boundary"]["zero1"]
    assert zero1["2"] > zero1["1"]
    assert zero1["4"] == zero1["2"]


def test_fsdps_boundary_climbs_at_every_device_count(nb):
    fsdp = nb.results["boundary"]["fsdp"]
    counts = sorted(fsdp, key=int)
    assert all(fsdp[b] > fsdp[a] for a, b in zip(counts[:-1], counts[1:], strict=True))
    zero1 = nb.results["boundary"]["zero1"]
    assert all(fsdp[n] >= zero1[n] for n in counts)


def test_on_one_device_fsdp_fits_a_model_ddp_does_not_ddps_buckets_are_why(nb, rows):
    boundary = nb.results["boundary"]
    assert boundary["fsdp"]["1"] > boundary["ddp"]["1"]
    params = nb.results["params"]
    ddp, fsdp = rows["ddp", 1]["at_peak"], rows["fsdp", 1]["at_peak"]
    assert ddp["other"] >= 3.5 * params  # a flat fp32 copy of the gradients, 4 bytes each
    assert fsdp["other"] < ddp["other"] - 1.5 * params
    assert rows["zero1", 1]["at_peak"]["other"] >= 3.5 * params


def test_the_black_line_is_the_estimators_prediction_for_each_cell(nb):
    assert all(a >= 0.8 for a in nb.results["agreement"].values())


def test_the_same_runs_in_plain_pytorch_have_labkits_losses(nb):
    cells = nb.cells_with("def train_sharded(")
    assert len(cells) == 1
    source = nb.cell(cells[0]).source
    for call in ("fully_shard(", "ZeroRedundancyOptimizer(", "MixedPrecisionPolicy(",
                 "DistributedDataParallel("):
        assert call in source, call
    for run in ("fsdp", "zero1", "mixed"):  # "Every table says equal"
        assert nb.results[f"plain_{run}_equal"], run
        assert nb.results[f"plain_{run}_max_diff"] < 1e-5, run


def test_the_bfloat16_runs_losses_are_not_the_fp32_runs(nb):
    assert nb.results["bf16_shift"] > 1e-5  # beyond what rounding in another order moves


def test_the_lessons_fsdp_run_is_written_as_a_script_with_its_torchrun_command(nb):
    cells = nb.cells_with("labkit.script(")
    assert len(cells) == 1
    shown = "".join("".join(o.get("data", {}).get("text/markdown", ""))
                    for o in nb.cell(cells[0]).get("outputs", []))
    assert "torchrun --nproc-per-node" in shown and "train_sharded_data_parallel.py" in shown
    assert "fully_shard(" in (COURSE / "train_sharded_data_parallel.py").read_text()
