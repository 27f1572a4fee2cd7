"""Notebook 08's capacity factor slider: each factor a real MoE run (tokens taken and dropped
per expert, the router's heat map), cached per factor and served only to the same
configuration, layout, device and capacity; headless it is a Figure."""

from __future__ import annotations

from dataclasses import replace

import pytest

import labkit
from labkit.lessons.long_context.capacity import CapacityExplorer
from labkit.models import GPTConfig, MoEGPTConfig
from labkit.training.layout import Layout

MOE = MoEGPTConfig(vocab_size=64, seq_len=16, d_model=16, n_heads=2, n_layers=1, n_experts=4,
                   top_k=2, capacity_factor=1.0)
CONFIG = labkit.TrainConfig(model=MOE, global_batch=4, steps=2, optimizer="sgd", lr=0.1)
LAYOUT = Layout(dp=2, ep=2)


def test_capacity_slider_shows_each_factors_measured_run(two):
    box = labkit.widgets.capacity_slider(two, CONFIG, LAYOUT, [0.5, 2.0], background=False)
    explorer = box.explorer
    assert "capacity factor 0.5" in box.message.value and box.plot.outputs
    box.slider.value = 2.0  # a new run, drawn before the call returns (background=False)
    assert "capacity factor 2" in box.message.value and box.status.value == ""
    low, high = explorer.run(0.5), explorer.run(2.0)
    assert len(explorer._cache) == 2  # moving back and forth trains nothing new
    box.slider.value = 0.5
    assert len(explorer._cache) == 2
    routed = CONFIG.global_batch * MOE.seq_len * MOE.top_k * CONFIG.steps
    for run in (low, high):  # every choice the router made was taken or dropped
        assert sum(run.taken()) + sum(run.dropped[0]) == routed
        assert max(max(step[0]) for step in run.load) <= run.capacity * CONFIG.global_batch
        assert run.dropped_share == pytest.approx(sum(run.dropped[0]) / routed)
    assert sum(low.dropped[0]) > 0 and sum(high.dropped[0]) < sum(low.dropped[0])
    assert low.capacity == 4 and high.capacity == 16  # ceil(f x 16 x 2 / 4)


def test_a_cached_run_is_served_only_to_the_same_runs(two):
    explorer = CapacityExplorer(two, CONFIG, LAYOUT)
    base = explorer._base()
    saved = two.memory_per_device
    two.memory_per_device = "64MiB"
    try:
        assert explorer._base() != base  # another capacity: those runs are not these
    finally:
        two.memory_per_device = saved
    assert explorer._base() == base
    with pytest.raises(ValueError, match="mixture of experts"):
        CapacityExplorer(two, CONFIG.replace(model=GPTConfig()), LAYOUT)
    with pytest.raises(ValueError, match="not one of the slider's"):
        labkit.widgets.capacity_slider(two, CONFIG, LAYOUT, [0.5, 2.0], value=1.0)
    with pytest.raises(ValueError, match="another cluster, config or layout"):
        labkit.widgets.capacity_slider(two, CONFIG, Layout(dp=2), [0.5], explorer=explorer)


def test_headless_capacity_slider_is_a_figure(two):
    fig = labkit.widgets.capacity_slider(two, CONFIG, LAYOUT, [1.0], interactive=False)
    assert "capacity factor 1" in fig._suptitle.get_text() and len(fig.axes) == 3


def test_bad_factors_are_refused_before_any_run(two):
    """A 0, NaN or negative factor anywhere in the list (not only the first one shown), or
    no factor at all, fails when the slider is made: no run trains first."""
    for factors in ([0.5, 0.0], [0.5, float("nan")], [-1.0, 1.0]):
        explorer = CapacityExplorer(two, CONFIG, LAYOUT)
        with pytest.raises(ValueError, match="capacity_factor must be a finite number above 0"):
            labkit.widgets.capacity_slider(two, CONFIG, LAYOUT, factors, explorer=explorer)
        assert len(explorer._cache) == 0
    with pytest.raises(ValueError, match="at least one capacity factor"):
        labkit.widgets.capacity_slider(two, CONFIG, LAYOUT, [])


def test_a_huge_factor_gives_at_most_one_slot_per_token():
    """Capacity past seq_len is empty slots (a token picks an expert once): 1e7 asked the
    ranks for an 80 GB buffer before."""
    assert MOE.capacity() == 8 and replace(MOE, capacity_factor=2.0).capacity() == 16
    assert replace(MOE, capacity_factor=1e7).capacity() == MOE.seq_len
