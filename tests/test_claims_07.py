"""The claims of notebook 07_putting_it_together, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson_fixture

FITTING = ("model parallel alone", "both")


nb = lesson_fixture("07_putting_it_together")


def _weights(results) -> int:
    """One device's weights (bytes): the parameters its uncapped run held."""
    return max(rank["parameters"] for rank in results["reference"]["category_peaks"])


def _held(results, name: str) -> dict[str, float]:
    """What the fullest rank of a run held at its peak, as fractions of one device's."""
    run = results["runs"][name]
    fullest = max(range(len(run["peaks"])), key=run["peaks"].__getitem__)
    at_peak, weights = run["at_peak"][fullest], _weights(results)
    return {"parameters": at_peak["parameters"] / weights,
            "optimizer": at_peak["optimizer"] / (2 * weights)}  # Adam: two moments


def test_one_device_needs_well_over_the_capacity(nb):
    results = nb.results
    assert "oom" in results["runs"]["one device"]
    assert max(results["reference"]["peaks"]) >= 1.5 * results["capacity"]


def test_one_device_holds_five_copies_of_the_weights_at_its_peak(nb):
    copies = max(nb.results["reference"]["peaks"]) / _weights(nb.results)
    assert 4.5 < copies < 5.5  # weights, gradients, two moments, Adam's temporaries


def test_data_parallelism_alone_holds_the_whole_model_on_every_rank(nb):
    run = nb.results["runs"]["data parallel alone"]
    assert "oom" in run, "DDP's full copies were meant not to fit"
    assert run["oom"]["breakdown"]["parameters"] == pytest.approx(_weights(nb.results), rel=0.01)


def test_model_parallelism_alone_and_both_fit_under_the_cap_with_room(nb):
    for name in FITTING:
        run = nb.results["runs"][name]
        assert "oom" not in run, name
        assert max(run["peaks"]) <= 0.9 * nb.results["capacity"], name


def test_with_tp4_every_rank_holds_a_quarter_of_the_weights_and_of_adams_moments(nb):
    held = _held(nb.results, "model parallel alone")
    assert held["parameters"] == pytest.approx(0.25, abs=0.01)
    assert held["optimizer"] == pytest.approx(0.25, abs=0.01)


def test_with_dp2_tp2_half_of_adams_moments_and_replicates_copy_of_the_half(nb):
    held = _held(nb.results, "both")
    assert held["optimizer"] == pytest.approx(0.5, abs=0.01)
    assert held["parameters"] == pytest.approx(1.0, abs=0.02)  # its half, and a working copy


def test_sgd_would_also_have_fitted_one_device(nb):
    assert 2 * _weights(nb.results) < 0.8 * nb.results["capacity"]  # weights and gradients


def test_tp4_sends_more_activation_bytes_per_rank_than_dp2_tp2(nb):
    runs = nb.results["runs"]
    assert runs["model parallel alone"]["wire_bytes"]["tp"] > runs["both"]["wire_bytes"]["tp"]


def test_the_copies_all_reduce_their_half_of_the_gradients_once_a_step(nb):
    # a ring AllReduce between two ranks sends each rank's whole tensor once
    dp = nb.results["runs"]["both"]["wire_bytes"]["dp"]
    assert dp == pytest.approx(_weights(nb.results) / 2, rel=0.02)
    assert nb.results["dim_bytes"] == nb.results["runs"]["both"]["wire_bytes"]


def test_times_are_said_to_be_ranks_taking_turns_when_ranks_share_cores(nb):
    [cell] = nb.cells_with("describe_runs(")
    printed = "".join(o.get("text", "") for o in nb.cell(cell).outputs)
    for name in FITTING:
        assert nb.results["runs"][name]["median_step_s"] > 0
    assert ("ranks sharing cores" in printed) == nb.results["oversubscribed"]


def test_every_collective_runs_on_its_own_dimensions_group(nb):
    assert set(nb.results["runs"]["both"]["comm_by_dim"]) == {"dp", "tp"}
    assert set(nb.results["runs"]["model parallel alone"]["comm_by_dim"]) == {"tp"}


def test_the_ranks_of_a_tensor_parallel_group_are_consecutive(nb):
    n = nb.results["world_size"]
    assert nb.results["groups"] == [[r, r + 1] for r in range(0, n, 2)]
    assert nb.results["check"]["status"] == "passed"


def test_the_composed_run_trains_as_one_device(nb):
    assert nb.results["loss_gap"] < 1e-4
    losses = nb.results["reference_losses"]
    assert losses[-1] < losses[0]


def test_the_estimator_traces_composed_layouts_too(nb):
    for name in FITTING:
        assert nb.results["runs"][name]["estimate_error"] < 0.10, name


def test_the_same_2d_run_in_plain_pytorch_gives_the_same_losses(nb):
    """"The same run, in plain PyTorch": the learner's compose() (init_device_mesh,
    parallelize_module on "tp" then fully_shard on "dp") under a plain training loop, run on
    the lesson's ranks, and labkit's *both* step by step."""
    [cell] = nb.cells_with("def train_2d_in_plain_pytorch(")
    source = nb.cell(cell).source
    for call in ("ColwiseParallel()", "RowwiseParallel()", "= compose(ctx, model, plan",
                 "cluster.run(", 'answer="compose"'):
        assert call in source, call
    [answer] = nb.cells_with("def compose(")
    answer = nb.cell(answer).source
    for call in ("init_device_mesh(", 'mesh_dim_names=("dp", "tp")', "parallelize_module(",
                 "fully_shard("):
        assert call in answer, call
    assert answer.index("parallelize_module(") < answer.index("fully_shard(")  # torchtitan's
    assert answer_cell_comes_first(nb, "def compose(", "def train_2d_in_plain_pytorch(")
    assert nb.results["plain_2d_equal"] and nb.results["plain_2d_gap"] < 1e-5
    assert nb.results["plain_2d_losses"] == pytest.approx(nb.results["runs"]["both"]["losses"],
                                                          abs=1e-5)


def test_the_lesson_writes_its_script_next_to_the_notebook(nb):
    """"Take it to your GPUs": labkit.script writes train_composed.py and shows it with the
    torchrun command; it holds the mesh and the calls of labkit's *both*."""
    assert nb.results["script_path"] == "train_composed.py"
    [cell] = nb.cells_with("labkit.script(")
    shown = "".join(o.get("data", {}).get("text/markdown", "") for o in nb.cell(cell).outputs)
    assert "torchrun --nproc-per-node" in shown and "train_composed.py" in shown
    for call in ("init_device_mesh(", "parallelize_module(", "replicate("):
        assert call in shown, call


def answer_cell_comes_first(nb, answer: str, plain: str) -> bool:
    """The exercise's cell comes before the plain run that calls it."""
    return nb.cells_with(answer)[0] < nb.cells_with(plain)[0]
