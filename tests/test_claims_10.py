"""The claims of notebook 10_when_a_gpu_dies, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("10_when_a_gpu_dies")


def test_recorded_values(nb):
    results = nb.results
    steps, every, at = results["steps"], results["checkpoint_every"], results["kill_at_step"]
    assert "RankError" in results["error"] and f"rank {results['kill_rank']}" in results["error"]
    resumed = (at - 1) // every * every  # the save due at the failure's step never happened
    assert results["resumed_at"] == resumed and results["lost_steps"] == at - resumed > 0
    assert results["from_checkpoint"] == [True] * resumed + [False] * (steps - resumed)
    assert results["recovered_losses"] == results["reference_losses"][:steps]  # bit for bit
    assert results["continued_resumed_at"] == steps
    assert results["fewer"] < results["world_size"]
    assert results["continued_losses"][:steps] == results["recovered_losses"]
    assert results["fewer_gap"] < 1e-4  # resharded onto fewer ranks: float rounding only
    assert results["save_s"] > 0 and results["step_s"] > 0 and results["young_daly_steps"] >= 1
    assert results["check"]["status"] == "passed"
    assert results["failed_after"] == at  # killed by the widget's kill() at the planned step
    projected = results["projected"]  # labkit.checkpoint.project: never measured
    assert all(0 < row["overhead"] < 0.5 and row["interval_s"] > row["save_s"] > 0
               for row in projected.values()), projected
