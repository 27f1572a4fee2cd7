"""The claims of notebook 04_tensor_parallel, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import re

import pytest

from tests.lessons import (
    COURSE,
    assert_each_cheaper_lever_fits_one_device,
    assert_out_of_one_device_by_half_again,
    lesson_fixture,
)

nb = lesson_fixture("04_tensor_parallel")


def test_both_joined_results_equal_the_product_in_one_piece(nb):
    assert nb.results["split_errors"] == {"column": 0.0, "row": 0.0}


def test_the_hand_written_layers_train_to_dtensors_losses_to_float_rounding(nb):
    """"no further than float rounding": tp_kind="naive" beside the default, the same
    config; the default run is the tp strategy's run further down, loss for loss."""
    results = nb.results
    naive, dtensor = results["hand_tp_losses"]["naive"], results["hand_tp_losses"]["dtensor"]
    assert len(naive) == len(dtensor) == len(results["losses"]["tp"])
    gap = max(abs(a - b) for a, b in zip(naive, dtensor, strict=True))
    assert results["hand_tp_max_difference"] == gap < 1e-6
    assert dtensor == results["losses"]["tp"]  # the same config, the same engine
    assert len(set(naive)) > 1  # it trained: the loss moved


def test_a_model_too_wide_for_one_device_by_half_again(nb):
    assert_out_of_one_device_by_half_again(nb.results)


def test_either_cheaper_lever_alone_would_fit_this_model_on_one_device(nb):
    assert_each_cheaper_lever_fits_one_device(nb.results)


def test_the_same_model_split_over_the_devices_fits_with_room(nb):
    assert max(nb.results["tp_peaks"]) <= 0.85 * nb.results["capacity"]


def test_the_two_curves_lie_on_top_of_each_other(nb):
    losses = nb.results["losses"]
    assert all(abs(a - b) < 1e-4 * abs(b) for a, b in zip(losses["tp"], losses["reference"],
                                                           strict=True))


def test_parameters_gradients_and_optimizer_state_shrink_to_about_1_over_n(nb):
    results = nb.results
    n, whole = results["world_size"], results["at_peak"]["reference"]
    assert all(p < 1.1 * results["parameters"]["reference"] / n
               for p in results["parameters"]["tp"])
    for rank in results["at_peak"]["tp"]:
        for part in ("parameters", "gradients", "optimizer"):
            assert rank[part] < 1.1 * whole[part] / n, part


def test_one_all_reduce_per_pair_forward_and_all_but_the_first_backward(nb):
    results = nb.results
    pairs = results["n_layers"] // 2  # forward: one AllReduce per pair; backward: all but 1st
    rows = results["per_layer"]
    assert sum(r["calls"] for r in rows if r["phase"] == "forward") == pairs
    assert sum(r["calls"] for r in rows if r["phase"] == "backward") == pairs - 1
    # each carries batch x width numbers, whatever the size of the weights
    assert all(r["bytes"] == 4 * r["shape"][0] * r["shape"][1] for r in rows)


def test_on_a_ring_each_rank_sends_2_n_minus_1_over_n_of_the_tensors(nb):
    results = nb.results
    rows, n, pairs = results["per_layer"], results["world_size"], results["n_layers"] // 2
    total = sum(r["bytes"] for r in rows)
    assert results["step_comm"] == {"all_reduce": [2 * pairs - 1, total,
                                                   pytest.approx(2 * (n - 1) / n * total)]}


def test_ddps_line_is_flat_tps_rises_with_the_batch_and_crosses_it(nb):
    results = nb.results
    tp = [r for r in results["versus"] if r["strategy"] == "tp"]
    ddp = [r for r in results["versus"] if r["strategy"] == "ddp"]
    assert all(r["bytes"] * tp[0]["batch"] == tp[0]["bytes"] * r["batch"] for r in tp)
    assert len({r["bytes"] for r in ddp}) == 1
    assert tp[0]["bytes"] < ddp[0]["bytes"] and tp[-1]["bytes"] > ddp[-1]["bytes"]
    assert tp[0]["batch"] < results["crossover"] < tp[-1]["batch"]


def test_the_links_table_says_plainly_which_figures_are_unverified(nb):
    cell = nb.cell(nb.cells_with("links_table()")[0])
    text = "".join(o.get("text", "") for o in cell.outputs)
    assert "UNSURE" not in text and "unverified:" in text


def test_the_same_run_in_plain_pytorch_gives_equal_losses(nb):
    """"Equal, not merely close": parallelize_module with a plan of ColwiseParallel and
    RowwiseParallel on a mesh from init_device_mesh, against labkit.train's tp run."""
    assert nb.results["plain_tp_equal"] and nb.results["plain_max_difference"] == 0.0
    [index] = nb.cells_with("def train_tensor_parallel(")
    source = nb.cell(index).source
    for call in ("parallelize_module(", "ColwiseParallel(", "RowwiseParallel(",
                 "init_device_mesh(", "torch.optim.Adam("):
        assert call in source, call
    assert "labkit.train" not in source and "labkit.parallel" not in source
    assert len(source.splitlines()) <= 40, "the plain function stays short"


def test_the_printed_weight_is_a_dtensor_sharded_by_output_features(nb):
    """"its placement over the mesh (Shard(dim=0) ...) and the shape of the shard"."""
    [index] = nb.cells_with("cluster.run(train_tensor_parallel")
    printed = "".join(o.get("text", "") for o in nb.cell(index).outputs)
    n = nb.results["world_size"]
    found = re.search(r"a DTensor of global shape \((\d+), (\d+)\), placements "
                      r"\(Shard\(dim=0\),\); this rank holds \((\d+), (\d+)\)", printed)
    assert found, printed
    rows, columns, local_rows, local_columns = map(int, found.groups())
    assert (local_rows, local_columns) == (rows // n, columns)


def test_the_lessons_run_is_written_as_a_script_for_torchrun(nb):
    results = nb.results
    script = COURSE / results["script_path"]
    assert script.name.startswith("train_") and script.parent == COURSE
    assert results["script_command"] == (f"torchrun --nproc-per-node {results['world_size']} "
                                         f"{script.name}")
    text = script.read_text()
    for call in ("init_device_mesh(", "parallelize_module(", "ColwiseParallel()",
                 "RowwiseParallel()"):
        assert call in text, call
