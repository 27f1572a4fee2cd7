"""The GPT trained with ``cp`` in its layout: the same losses and SGD weights as one device
(cp alone, with dp, with fsdp), its traffic filed under cp, each rank's peak equal to the
estimate traced through the ring, activation memory per rank falling with cp, a sequence
that runs one capped device out of memory training on 2 ranks under the same cap, and the
layouts it refuses before any rank starts."""

from __future__ import annotations

import pytest

import labkit
from labkit.models import GPTConfig
from labkit.training.layout import Layout
from labkit.training.run import resolve
from tests.conftest import assert_trains_as

GPT = GPTConfig(vocab_size=64, seq_len=32, d_model=32, n_heads=2, n_layers=2)
SGD = dict(global_batch=4, steps=3, optimizer="sgd", lr=0.1, return_weights=True)


@pytest.fixture(scope="module")
def reference(four):
    with four.resized(1):
        return labkit.train(four, labkit.TrainConfig(model=GPT, **SGD))


@pytest.mark.parametrize("layout", [Layout(cp=2), Layout(cp=4), Layout(dp=2, cp=2),
                                    Layout(fsdp=2, cp=2)], ids=str)
def test_cp_trains_as_one_device(four, reference, layout):
    with four.resized(layout.size):
        report = labkit.train(four, labkit.TrainConfig(model=GPT, layout=layout, **SGD))
    assert_trains_as(reference, report)
    assert report.extra["cp_engine"] == "labkit ring"  # on CPU ranks (engine.py)
    cp = report.comm_by_dim()["cp"]
    assert {"send", "recv", "all_reduce"} <= set(cp), cp
    # each step: forward passes cp - 1 key/value blocks per layer, backward cp (the last
    # hop takes the key/value gradients home); 2 layers
    assert cp["send"]["calls"] == 2 * (2 * layout.cp - 1)
    for rank, peak in enumerate(report.peak_bytes):
        assert abs(peak - report.estimate["per_rank"][0]) <= 0.02 * peak, (rank, peak)


def test_naive_dp_then_cp_trains_as_one_device(four, reference):
    """The hand-written sync steps composed: the mean over dp, then over cp (Built.grad_sync,
    training/build/sync.py), is one device's step."""
    with four.resized(4):
        report = labkit.train(four, labkit.TrainConfig(model=GPT, layout=Layout(dp=2, cp=2),
                                                       dp_kind="naive", **SGD))
    assert report.run.engines.dp_kind == "naive"
    assert_trains_as(reference, report)


def test_activation_memory_per_rank_falls_with_cp(four):
    long = GPTConfig(vocab_size=64, seq_len=256, d_model=32, n_heads=2, n_layers=2)
    config = labkit.TrainConfig(model=long, global_batch=2, steps=2, optimizer="sgd")
    activations = {}
    for cp in (1, 2, 4):
        with four.resized(cp):
            report = labkit.train(four, config.replace(layout=Layout(cp=cp)))
        activations[cp] = max(r["memory"]["category_peaks"]["activations"]
                              for r in report.ranks)
        estimated = report.estimate["category_peaks"]["activations"]
        assert abs(estimated - activations[cp]) <= 0.05 * activations[cp], (cp, estimated)
    # the blocks' tensors fall as 1/cp; each rank's block of scores falls faster
    assert activations[2] < 0.6 * activations[1], activations
    assert activations[4] < 0.6 * activations[2], activations


def test_a_sequence_that_runs_one_device_out_of_memory_trains_on_two(four):
    long = GPTConfig(vocab_size=64, seq_len=512, d_model=32, n_heads=2, n_layers=2)
    config = labkit.TrainConfig(model=long, global_batch=2, steps=2, optimizer="sgd")
    one = labkit.estimate_memory(config, 1).peak_bytes
    two = labkit.estimate_memory(config.replace(layout=Layout(cp=2)), 2).peak_bytes
    cap = (one + two) // 2  # between the two estimates
    with four.resized(1), pytest.raises(labkit.DeviceOOM):
        labkit.train(four, config, memory_per_device=cap)
    with four.resized(2):
        report = labkit.train(four, config.replace(layout=Layout(cp=2)), memory_per_device=cap)
    assert max(report.peak_bytes) <= cap and len(report.losses) == 2


@pytest.mark.parametrize("model, layout, match", [
    ("mlp", Layout(cp=2), "has no attention"),
    (GPTConfig(seq_len=62), Layout(cp=2), "multiple of 4"),
    (GPT, Layout(cp=2, tp=2), "not with tp or pp"),
    (GPT, Layout(cp=2, pp=2), "not with tp or pp"),
])
def test_cp_layouts_refused_before_any_rank_starts(model, layout, match):
    config = labkit.TrainConfig(model=model, layout=layout, global_batch=4)
    with pytest.raises(ValueError, match=match):
        resolve(config.replace(layout=layout), layout.size)


def test_cp_refuses_levers_it_is_not_built_with():
    layout = Layout(cp=2)
    for change, match in [({"precision": "bf16"}, "fp32"),
                          ({"activation_checkpointing": True}, "checkpointing")]:
        config = labkit.TrainConfig(model=GPT, layout=layout, global_batch=4, **change)
        with pytest.raises(ValueError, match=match):
            resolve(config.replace(layout=layout), 2)
    config = labkit.TrainConfig(model=GPT, layout=layout, global_batch=4)
    with pytest.raises(ValueError, match="point to point"):
        resolve(config.replace(layout=layout), 2, device_type="cuda", backend="gloo")
