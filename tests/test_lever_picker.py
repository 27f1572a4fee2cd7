"""Notebook 01's lever picker (labkit/lessons/memory_wall/levers.py): labels, a run that fits, a
run that does not (its OOM kept, not raised), and the cache the picker draws from. About 5 s on one
rank with a 0.2M-parameter GPT."""

from __future__ import annotations

import pytest

import labkit
from labkit.lessons.memory_wall.levers import LeverPicker, lever_name, run_lever, try_levers
from labkit.models import sized


@pytest.mark.parametrize("options, name", [
    ({}, "plain"),
    ({"activation_checkpointing": True, "precision": "fp32", "grad_accumulation": 1},
     "checkpointing"),
    ({"activation_checkpointing": True, "precision": "bf16", "grad_accumulation": 4},
     "checkpointing + bf16 + accumulation x4"),
])
def test_a_lever_is_named_by_what_is_on(options, name):
    assert lever_name(options) == name


def test_levers_run_for_real_and_an_oom_is_kept_as_a_result():
    config = labkit.TrainConfig(model=sized("gpt", 2e5), global_batch=16, steps=2)
    with labkit.Cluster(1, memory_per_device="32MiB") as cluster:
        picker = LeverPicker(cluster, config)
        plain = picker.run(False, "fp32", 1)
        assert picker.run(False, "fp32", 1) is plain  # cached, not trained again
        saved = picker.run(True, "fp32", 4)
        assert saved.oom is None and saved.peak_bytes < plain.peak_bytes
        assert saved.estimated_bytes == pytest.approx(saved.peak_bytes, rel=0.1)
    with labkit.Cluster(1, memory_per_device="4MiB") as small:
        failed = run_lever(small, config, {"precision": "bf16"})
    assert failed.oom is not None and failed.step_s is None
    assert failed.oom["capacity"] == 4 * 2**20


def test_a_run_keeps_the_levers_it_really_ran_with_and_the_picker_no_stale_run():
    # a config that already accumulates: its "plain" run is not the picker's plain run
    config = labkit.TrainConfig(model=sized("gpt", 2e5), global_batch=16, steps=2,
                                grad_accumulation=2)
    with labkit.Cluster(1) as cluster:
        (seeded,) = try_levers(cluster, config, levers={})
        assert seeded.options["grad_accumulation"] == 2 and seeded.name == "accumulation x2"
        picker = LeverPicker(cluster, config, [seeded])
        assert picker.run(False, "fp32", 2) is seeded
        assert picker.run(False, "fp32", 1).options["grad_accumulation"] == 1
        other = config.replace(global_batch=8)
        with pytest.raises(ValueError, match="another configuration"):
            LeverPicker(cluster, other, [seeded])
    with labkit.Cluster(1, memory_per_device="64MiB") as capped:  # same config, other cap
        with pytest.raises(ValueError, match="another cluster or capacity"):
            LeverPicker(capped, config, [seeded])


def test_the_picker_message_compares_only_with_a_plain_run_that_fitted():
    from labkit.lessons.memory_wall.levers import LeverRun
    from labkit.lessons.memory_wall.levers_widget import _message

    failed = LeverRun("plain", {}, {"activations": 9 << 20}, 9 << 20, 0, None, {},
                      {"requested": 1 << 20, "capacity": 8 << 20})
    fits = LeverRun("checkpointing", {}, {"activations": 6 << 20}, 6 << 20, 6 << 20, 0.02, {})
    said = _message(failed, fits)
    assert "nan" not in said and "below the plain" not in said and "did not fit" in said


def test_the_picker_trains_again_when_the_cluster_capacity_changes(monkeypatch):
    """A cached run is served only to the ranks and capacity it ran on (as the capacity
    slider's cache): after ``cluster.memory_per_device`` changes, a pick is trained again.
    No rank starts: ``run_lever`` is a stand-in that counts its calls."""
    from labkit.lessons.memory_wall import levers

    class Ranks:
        world_size, memory_per_device = 1, 32 * 2**20

    made = []

    def stand_in(cluster, config, options):
        made.append(cluster.memory_per_device)
        ran = levers.levers_of(config.replace(**options))
        return levers.LeverRun(lever_name(ran), ran, {}, 0, 0, 0.1, {}, None,
                               levers.base_of(config, cluster))

    monkeypatch.setattr(levers, "run_lever", stand_in)
    cluster, config = Ranks(), labkit.TrainConfig(model=sized("gpt", 2e5), steps=2)
    picker = LeverPicker(cluster, config, [stand_in(cluster, config, {})])
    assert picker.run(False, "fp32", 1) is picker.run(False, "fp32", 1) and len(made) == 1
    cluster.memory_per_device = 8 * 2**20
    assert picker.run(False, "fp32", 1).base == levers.base_of(config, cluster)
    assert made == [32 * 2**20, 8 * 2**20]
