"""The claims of notebook 03_pipeline_parallel, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson


@pytest.fixture(scope="module")
def nb():
    return lesson("03_pipeline_parallel")


def test_recorded_values(nb):
    results = nb.results
    assert results["single_oom"], "the model was meant not to fit one device"
    for peaks in results["peaks"].values():
        assert max(peaks) <= results["capacity"]  # but it fits as stages
    losses = results["losses"]
    for name in ("gpipe", "1f1b"):  # micro-batching does not change the training
        assert all(abs(a - b) < 1e-5 for a, b in zip(losses[name], losses["naive"], strict=True))
    assert all(abs(a - b) < 1e-5 for a, b in zip(losses["gpipe"], losses["one_device"],
                                                  strict=True))  # the pipeline trains as one
    assert abs(results["bubble"]["naive"] - results["theory"]["naive"]) < 0.15
    assert results["activations"]["1f1b"] < results["activations"]["gpipe"]
