"""The claims of notebook 08_long_sequences_and_experts, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("08_long_sequences_and_experts")


def test_recorded_values(nb):
    results = nb.results
    peaks, capacity = results["peaks"], results["capacity"]
    longest = results["seq_options"][-1]
    assert peaks[str(longest)]["one device"] is None, "the longest sequence must OOM one device"
    cp = f"cp={results['cp']}"
    assert peaks[str(longest)][cp] is not None, f"... and train with {cp} under the same cap"
    assert all(p <= capacity for row in peaks.values() for p in row.values() if p is not None)
    assert 0.3 < results["peak_ratio"] < 1.0
    assert results["loss_gap"] < 1e-4  # ring attention is exact
    blocks = [sum(len(step["pairs"]) for step in rank) for rank in results["schedule"]]
    assert len(set(blocks)) == 1, blocks  # balanced: the same work on every rank
    assert results["check"]["status"] == "passed"
    slots = results["moe_capacity"] * results["global_batch"]
    assert all(0 < max(layer) <= slots for step in results["expert_load"] for layer in step)
    dense, moe = results["comparison"]["dense"], results["comparison"]["moe"]
    assert moe["params"] > dense["params"]
    assert results["all_to_all"]["calls"] > 0 and results["all_to_all"]["bytes"] > 0
    dropped = list(results["dropped"].values())
    assert dropped == sorted(dropped, reverse=True) and dropped[0] > 0
    by_expert = [sum(map(sum, layers)) for layers in results["dropped_by_expert"].values()]
    assert by_expert == sorted(by_expert, reverse=True) and by_expert[0] > 0  # the slider's
