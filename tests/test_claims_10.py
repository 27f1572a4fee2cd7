"""The claims of notebook 10_when_a_gpu_dies, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson_fixture

nb = lesson_fixture("10_when_a_gpu_dies")


@pytest.fixture(scope="module")
def projected(nb):
    return nb.results["projected"]  # labkit.lessons.checkpoints.project: never measured


def test_recorded_values(nb):
    results = nb.results
    assert results["save_s"] > 0 and results["step_s"] > 0 and results["young_daly_steps"] >= 1
    assert results["check"]["status"] == "passed"


def test_the_jobs_mtbf_is_one_gpus_divided_by_the_gpu_count(nb):
    mtbf = nb.results["mtbf_hours"]
    assert mtbf["gpu"] / mtbf["gpus"] == pytest.approx(mtbf["job"])
    assert mtbf["job"] < 24 and mtbf["gpu"] / (24 * 365) > 1  # every few hours; one: years


def test_the_killed_rank_stops_the_run_and_the_error_names_it(nb):
    results = nb.results
    assert "RankError" in results["error"] and f"rank {results['kill_rank']}" in results["error"]
    assert results["failed_after"] == results["kill_at_step"]  # killed at the planned step


def test_the_run_resumes_from_the_newest_good_checkpoint_and_redoes_the_lost_steps(nb):
    results = nb.results
    steps, every, at = results["steps"], results["checkpoint_every"], results["kill_at_step"]
    resumed = (at - 1) // every * every  # the save due at the failure's step never happened
    assert results["resumed_at"] == resumed and results["lost_steps"] == at - resumed > 0
    assert results["from_checkpoint"] == [True] * resumed + [False] * (steps - resumed)


def test_losses_identical_to_the_uninterrupted_run_bit_for_bit(nb):
    results = nb.results
    assert results["recovered_losses"] == results["reference_losses"][:results["steps"]]


def test_resumed_on_fewer_ranks_not_bit_for_bit_but_within_float_rounding(nb):
    results = nb.results
    assert results["fewer"] < results["world_size"]
    assert results["continued_resumed_at"] == results["steps"]
    assert results["continued_losses"][:results["steps"]] == results["recovered_losses"]
    assert 0 < results["fewer_gap"] < 1e-4


def test_each_projected_size_has_a_layout_that_fits(projected):
    assert len(projected) == 3
    for name, row in projected.items():
        assert row["fits"], name
        assert 0 < row["overhead"] < 0.5 and row["interval_s"] > row["save_s"] > 0, name


def test_sharding_over_more_gpus_c_and_m_fall_together_the_fraction_lost_changes_little(
        projected):
    middle, largest = (row for name, row in projected.items() if name.startswith("70B"))
    gpus = largest["gpus"] / middle["gpus"]
    assert middle["mtbf_s"] / largest["mtbf_s"] == pytest.approx(gpus)
    assert gpus / 2 < middle["save_s"] / largest["save_s"] <= gpus
    assert largest["overhead"] / middle["overhead"] < 1.5


def test_on_the_largest_cluster_communication_and_bubble_take_most_of_the_step(projected):
    *others, largest = projected.values()
    split = largest["split"]
    assert split["exposed_comm_s"] + split["bubble_s"] > split["compute_s"]
    assert all(largest["mfu"] < 0.5 * row["mfu"] for row in others)


def test_the_same_save_and_resume_in_plain_pytorch_gives_the_same_losses(nb):
    """"The same run, in plain PyTorch": the learner's save_checkpoint and load_checkpoint
    (get_state_dict, dcp.save; dcp.load, set_state_dict) under a plain FSDP2 loop, a fresh
    model resumed on the lesson's ranks, give the losses of labkit's resumed run, which are
    the uninterrupted run's."""
    [cell] = nb.cells_with("def train_save_resume_in_plain_pytorch(")
    source = nb.cell(cell).source
    for call in ("save_checkpoint(model, optimizer, resume_at, folder)",
                 "load_checkpoint(model, optimizer, folder)", "fully_shard(", "cluster.run("):
        assert call in source, call
    [answer] = nb.cells_with("def save_checkpoint(")  # the exercise, before the plain run
    assert answer < cell
    for call in ("torch.distributed.checkpoint", "get_state_dict(", "dcp.save(", "dcp.load(",
                 "set_state_dict("):
        assert call in nb.cell(answer).source, call
    results = nb.results
    assert results["plain_dcp_equal"] and results["plain_dcp_gap"] < 1e-5
    assert 0 < results["plain_dcp_resumed_at"] < results["steps"]
    uninterrupted = results["reference_losses"][:results["steps"]]
    for losses in (results["recovered_losses"], uninterrupted):
        assert results["plain_dcp_losses"] == pytest.approx(losses, abs=1e-6)
