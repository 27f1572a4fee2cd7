"""The memory levers of one device (activation checkpointing, precision, gradient
accumulation): checked before any rank starts, each one's measured saving against the
estimator's, and each one's training against the plain run's."""

from __future__ import annotations

import pytest
import torch

import labkit
from labkit.models import GPTConfig, MLPConfig, build_model
from labkit.runtime.costs import model_state_bytes
from labkit.runtime.memory.oom import CATEGORIES, MODEL_STATE
from labkit.training.layout import Layout
from labkit.training.run import resolve

GPT = GPTConfig()  # 2 blocks, 64 tokens per sample: activations dominate at batch 16
LEVERS = {"checkpointing": {"activation_checkpointing": True},
          "accumulation": {"grad_accumulation": 4},
          "bf16": {"precision": "bf16"},
          "mixed": {"precision": "mixed"}}
TOLERANCE = 0.10  # estimate vs measurement, of a saving and of each category


@pytest.mark.parametrize("fields, error, message", [
    ({"grad_accumulation": 0}, ValueError, "grad_accumulation must be at least 1"),
    ({"grad_accumulation": 2.0}, TypeError, "grad_accumulation must be a whole number"),
    ({"activation_checkpointing": "yes"}, TypeError, "must be True or False"),
])
def test_lever_fields_are_checked_where_written(fields, error, message):
    with pytest.raises(error, match=message):
        labkit.TrainConfig(model=GPT, **fields)


@pytest.mark.parametrize("fields, layout, message", [
    ({"model": MLPConfig(), "activation_checkpointing": True}, Layout(), "choose model='gpt'"),
    ({"grad_accumulation": 2, "micro_batches": 2}, Layout(pp=2),
     "set micro_batches=4 and grad_accumulation=1"),
    ({"precision": "mixed", "micro_batches": 2}, Layout(pp=2), "use precision='fp32'"),
    ({"grad_accumulation": 3}, Layout(dp=2), "over 2 ranks x 3 micro-batches"),
])
def test_levers_refused_where_they_do_not_apply(fields, layout, message):
    config = labkit.TrainConfig(**{"model": GPT, "global_batch": 16, **fields}, layout=layout)
    with pytest.raises(ValueError, match=message):
        resolve(config.replace(layout=layout), layout.size)


@pytest.fixture(scope="module")
def runs(one):
    """The plain run and one run per lever, 1 rank, Adam, with the estimate beside each."""
    return {name: labkit.train(one, model=GPT, global_batch=16, steps=3, optimizer="adam",
                               return_weights=True, **fields)
            for name, fields in {"plain": {}, **LEVERS}.items()}


def _measured(report) -> dict:
    return report.ranks[0]["memory"]


@pytest.mark.parametrize("lever", LEVERS)
def test_each_levers_saving_matches_the_estimate(runs, lever):
    plain, run = runs["plain"], runs[lever]
    saved = plain.peak_bytes[0] - run.peak_bytes[0]
    saved_estimate = plain.estimate["peak_bytes"] - run.estimate["peak_bytes"]
    assert saved > 0.1 * plain.peak_bytes[0], (lever, saved)  # each lever saves memory here
    assert abs(saved_estimate - saved) <= TOLERANCE * saved, (saved, saved_estimate)
    measured = _measured(run)
    for category in CATEGORIES:  # at the peak, and each category's own highest
        for key in ("at_peak", "category_peaks"):
            gap = abs(run.estimate[key][category] - measured[key][category])
            assert gap <= TOLERANCE * measured["peak_bytes"], (lever, key, category)


def test_precision_sets_the_bytes_of_each_category(runs):
    fp32, bf16, mixed = (_measured(runs[n])["category_peaks"] for n in ("plain", "bf16", "mixed"))
    assert bf16["parameters"] * 2 == fp32["parameters"]
    assert bf16["gradients"] * 2 == fp32["gradients"]
    # Adam's two moments halve; its step counters stay fp32 scalars (4 bytes per tensor)
    assert bf16["optimizer"] * 2 == pytest.approx(fp32["optimizer"], rel=0.01)
    for category in MODEL_STATE:  # mixed keeps fp32 master weights, gradients and moments
        assert mixed[category] == fp32[category]
    assert mixed["activations"] < 0.8 * fp32["activations"]  # bf16 compute saves bf16 tensors


def test_model_state_per_parameter_is_the_formulas(runs):
    """What notebook 05's ZeRO picture can use: bytes per parameter of the runs themselves
    (labkit's "mixed" keeps fp32 state: the formula's "fp32" row, not the paper's mixed)."""
    params = list(build_model(GPT, "meta", 0).parameters())
    n, largest = sum(p.numel() for p in params), max(p.numel() for p in params)
    for run, row, width in (("plain", "fp32", 4), ("mixed", "fp32", 4), ("bf16", "bf16", 2)):
        formula, peaks = model_state_bytes(n, precision=row), _measured(runs[run])["category_peaks"]
        assert peaks["parameters"] == formula["parameters"]
        assert peaks["gradients"] == formula["gradients"]
        # Adam's moments, its fp32 step counters (4 bytes per tensor) and, at its peak, the
        # temporaries of one tensor's update (foreach=False: one tensor at a time; here two
        # of the largest tensor's size and a few small ones)
        extra = peaks["optimizer"] - formula["optimizer"] - 4 * len(params)
        assert 2 * width * largest <= extra <= 3 * width * largest, (run, extra)


def test_checkpointing_and_accumulation_save_activations(runs):
    plain = _measured(runs["plain"])["category_peaks"]["activations"]
    for lever in ("checkpointing", "accumulation"):
        assert _measured(runs[lever])["category_peaks"]["activations"] < 0.7 * plain, lever


def test_checkpointing_trains_exactly_as_without(runs):
    plain, run = runs["plain"], runs["checkpointing"]
    assert run.losses == plain.losses  # recomputation repeats the same ops in the same order
    for name, weight in plain.ranks[0]["weights"].items():
        torch.testing.assert_close(run.ranks[0]["weights"][name], weight, rtol=0, atol=0)


def test_accumulation_equals_one_full_batch_step(one):
    # SGD: its update is proportional to the gradient, so a rounding-level difference in the
    # summed gradient stays rounding-level in the weights (Adam divides it by ~|g|).
    runs = [labkit.train(one, model=GPT, global_batch=16, steps=3, optimizer="sgd", lr=0.1,
                         return_weights=True, estimate=False, grad_accumulation=k)
            for k in (1, 4)]
    assert runs[1].losses == pytest.approx(runs[0].losses, rel=1e-5)
    for name, weight in runs[0].ranks[0]["weights"].items():
        torch.testing.assert_close(runs[1].ranks[0]["weights"][name], weight, rtol=1e-5,
                                   atol=1e-6)


# bfloat16 keeps 8 bits of mantissa (~0.4% per rounding): losses within 2% with bf16
# weights and optimizer state, 0.5% with fp32 master weights and bf16 compute.
LOSS_TOLERANCE = {"bf16": 0.02, "mixed": 0.005}


@pytest.mark.parametrize("precision", LOSS_TOLERANCE)
def test_lower_precision_trains_close_to_fp32(runs, precision):
    assert runs[precision].losses == pytest.approx(runs["plain"].losses,
                                                   rel=LOSS_TOLERANCE[precision])


def test_levers_on_two_ranks_fsdp_mixed_and_ddp_accumulation(two):
    """FSDP2 under MixedPrecisionPolicy, and DDP accumulating without syncing (no_sync)."""
    fp32 = labkit.train(two, model=GPT, strategy="fsdp", global_batch=16, steps=3,
                        estimate=False)
    mixed = labkit.train(two, model=GPT, strategy="fsdp", global_batch=16, steps=3,
                         precision="mixed", activation_checkpointing=True)
    assert mixed.estimate_error() < TOLERANCE
    assert mixed.losses == pytest.approx(fp32.losses, rel=LOSS_TOLERANCE["mixed"])
    ddp = [labkit.train(two, model=GPT, strategy="ddp", global_batch=16, steps=3,
                        optimizer="sgd", lr=0.1, grad_accumulation=k, return_weights=True)
           for k in (1, 2)]
    assert ddp[1].estimate_error() < TOLERANCE
    assert ddp[1].peak_bytes[0] < ddp[0].peak_bytes[0]
    for name, weight in ddp[0].ranks[0]["weights"].items():
        torch.testing.assert_close(ddp[1].ranks[0]["weights"][name], weight, rtol=1e-5,
                                   atol=1e-6)


def test_checkpointing_inside_pipeline_stages(two):
    """The blocks a stage holds are checkpointed there too (torch's schedule runs them)."""
    plain, run = (labkit.train(two, model=GPTConfig(n_layers=4), strategy="gpipe",
                               global_batch=16, micro_batches=2, steps=3,
                               activation_checkpointing=flag) for flag in (False, True))
    assert run.losses == plain.losses
    assert run.estimate_error() < TOLERANCE
    assert max(run.peak_bytes) < 0.9 * max(plain.peak_bytes)


def test_lever_boundaries_refuse_bad_requests_before_running(one):
    from labkit.lessons.memory_wall.lever_boundary import lever_boundaries

    with pytest.raises(ValueError, match="unknown levers"):
        lever_boundaries(one, levers=["turbo"])
    other = labkit.BoundaryMap("gpt", "ddp", 32 << 20, 16)  # an empty map: not this grid
    with pytest.raises(ValueError, match="same model, strategy, capacity"):
        lever_boundaries(one, levers=["bf16"], plain=other)


def test_lever_boundaries_refuse_a_plain_map_of_another_run(one):
    """The same sizes and world sizes are not enough: a plain map trained under another
    capacity, batch, model or strategy draws the wrong plain boundary beside the levers'."""
    from labkit.lessons.memory_wall.boundary import BoundaryCell
    from labkit.lessons.memory_wall.lever_boundary import lever_boundaries
    from labkit.models import count_parameters, sized

    sizes, worlds = (2e5, 1e6), (1, 2)
    cells = [BoundaryCell(count_parameters(sized("gpt", int(s))), n, True, 1, 1, True)
             for s in sizes for n in worlds]
    for fields in ({"capacity_bytes": 64 << 20}, {"global_batch": 32}, {"strategy": "fsdp"}):
        kept = {"model": "gpt", "strategy": "ddp", "capacity_bytes": 32 << 20,
                "global_batch": 16} | fields
        other = labkit.BoundaryMap(**kept, cells=list(cells))
        with pytest.raises(ValueError, match="same"):
            lever_boundaries(one, "gpt", sizes, worlds, "32MiB", 16, levers=["bf16"],
                             plain=other, confirm=False)


def test_the_cells_trained_are_either_side_of_the_boundary_whatever_the_order_of_sizes():
    from labkit.lessons.memory_wall.lever_boundary import LeverBoundary, LeverCell, _edge

    boundary = LeverBoundary("bf16", {}, [LeverCell(p, 1, p, p <= 20) for p in (10, 20, 30)])
    assert _edge(boundary, [30, 20, 10]) == _edge(boundary, [10, 20, 30]) == [20, 30]


def test_one_lever_named_as_a_string_is_that_lever(one):
    from labkit.lessons.memory_wall.lever_boundary import lever_boundaries

    maps = lever_boundaries(one, sizes=(2e5,), world_sizes=(2,), levers="bf16", confirm=False)
    assert [m.lever for m in maps] == ["plain", "bf16"]


def test_lever_boundaries_refuse_an_empty_grid_and_map_each_cell_once(one):
    from labkit.lessons.memory_wall.lever_boundary import lever_boundaries

    for grid in ({"sizes": ()}, {"world_sizes": []}):  # was: empty maps, then the plot failed
        with pytest.raises(ValueError, match="one value each at least"):
            lever_boundaries(one, levers=["bf16"], **grid)
    maps = lever_boundaries(one, sizes=(2e5, 2e5), world_sizes=(2, 2), levers=[], confirm=False)
    assert len(maps[0].cells) == 1  # was 4: the same cell estimated four times
