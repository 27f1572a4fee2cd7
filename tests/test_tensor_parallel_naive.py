"""``tp_kind="naive"``: labkit's hand-written Megatron layers train, and give the losses of
DTensor's ``parallelize_module`` and of one device; what it cannot compose with is refused
before any rank starts."""

from __future__ import annotations

import pytest
import torch

import labkit
from labkit.models import GPTConfig, MLPConfig
from labkit.parallel.tensor import ColumnParallelLinear, RowParallelLinear
from labkit.training.build import build, parallel_context
from labkit.training.run import resolve

MODELS = {"mlp": MLPConfig(n_layers=4), "gpt": GPTConfig(n_layers=2)}


@pytest.mark.parametrize("name", MODELS)
def test_naive_tp_trains_to_dtensors_losses_and_one_devices(one, two, name):
    config = labkit.TrainConfig(model=MODELS[name], global_batch=16, steps=4, lr=0.01,
                                optimizer="adam", return_weights=True)
    reference = labkit.train(one, config, estimate=False)
    tp = labkit.Layout(tp=2)
    dtensor = labkit.train(two, config, layout=tp, estimate=False)
    naive = labkit.train(two, config, layout=tp, tp_kind="naive", estimate=False)
    assert naive.losses == pytest.approx(dtensor.losses, rel=1e-6, abs=1e-7)
    assert naive.losses == pytest.approx(reference.losses, rel=1e-5)
    assert len(set(naive.losses)) == len(naive.losses)  # it trained: the loss moved
    # The weights, gathered whole again, equal DTensor's within 1% of one Adam step (lr).
    # Not the keys' bias: it adds the same score to every key of a query, which softmax
    # ignores, so its gradient is zero but for rounding, and Adam (dividing by the root of
    # the gradient's square) turns that rounding into steps of up to lr.
    for rank in naive.ranks:
        want = dtensor.ranks[rank["rank"]]["weights"]
        assert rank["weights"].keys() == want.keys()
        for key, value in rank["weights"].items():
            expected = want[key]
            if key.endswith("attn.qkv.bias"):  # [q; k; v]: leave out k's third
                keep = torch.ones_like(value, dtype=torch.bool)
                keep[value.numel() // 3: 2 * value.numel() // 3] = False
                value, expected = value[keep], expected[keep]
            torch.testing.assert_close(value, expected, rtol=0, atol=config.lr / 100)


def _layers_on_rank(ctx, run_dict: dict) -> dict:
    from labkit.training.run import Run

    built = build(parallel_context(ctx, Run.from_dict(run_dict)))
    kinds = {type(m).__name__ for m in built.model.modules()}
    dtensors = any(hasattr(p, "to_local") for p in built.model.parameters())
    return {"kinds": kinds, "dtensors": dtensors}


def test_the_hand_written_layers_are_what_trains(two):
    run = resolve(labkit.TrainConfig(model=GPTConfig(n_layers=1), layout=labkit.Layout(tp=2),
                                      tp_kind="naive"), world_size=2)
    assert run.engines.tp_kind == "naive" and "naive tp" in run.label
    for result in two.run(_layers_on_rank, run.to_dict()):
        assert {ColumnParallelLinear.__name__, RowParallelLinear.__name__} <= result["kinds"]
        assert not result["dtensors"]  # plain tensors: no DTensor anywhere
    default = resolve(labkit.TrainConfig(layout=labkit.Layout(tp=2)), world_size=2)
    assert default.engines.tp_kind == "dtensor"


@pytest.mark.parametrize("fields, message", [
    ({"layout": labkit.Layout(fsdp=2, tp=2)}, "does not compose with fsdp=2"),
    ({"layout": labkit.Layout(pp=2, tp=2)}, "does not compose with pp=2"),
    ({"layout": labkit.Layout(dp=2, tp=2)}, "dp=2 with dp_kind='ddp'"),
    # an engine named without its dimension would still wrap the shards as whole weights
    ({"layout": labkit.Layout(tp=4), "dp_kind": "ddp"}, "does not compose with dp_kind='ddp'"),
    ({"layout": labkit.Layout(tp=4), "dp_kind": "fsdp"}, "does not compose with dp_kind='fsdp'"),
    ({"layout": labkit.Layout(tp=1, dp=4)}, "has tp=1"),
    ({"layout": labkit.Layout(tp=4), "checkpoint_dir": "ckpt"}, "leave out checkpoint_dir"),
])
def test_naive_tp_refuses_what_it_cannot_run_before_any_rank_starts(fields, message):
    with pytest.raises(ValueError, match=message):
        resolve(labkit.TrainConfig(model="gpt", tp_kind="naive", **fields), world_size=4)


def test_a_bad_tp_kind_names_the_choices():
    with pytest.raises(ValueError, match="choose one of dtensor, naive"):
        labkit.TrainConfig(layout=labkit.Layout(tp=2), tp_kind="megatron")
    with pytest.raises(TypeError, match="chosen beside it"):
        labkit.Layout(tp=2, tp_kind="naive")


def test_naive_tp_composes_with_naive_data_parallelism(one, four):
    config = labkit.TrainConfig(model=MLPConfig(n_layers=2), global_batch=16, steps=3,
                                lr=0.01)
    reference = labkit.train(one, config, estimate=False)
    report = labkit.train(four, config, layout=labkit.Layout(dp=2, tp=2), tp_kind="naive",
                          dp_kind="naive", estimate=False)
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)


def test_the_estimator_traces_the_hand_written_layers():
    """The estimate runs the build and the step on fake tensors: the hand-written layers hold
    the same shards as DTensor's, so the same peak."""
    config = labkit.TrainConfig(model=GPTConfig(n_layers=2), layout=labkit.Layout(tp=2),
                                global_batch=8, steps=2)
    naive = labkit.estimate_memory(config.replace(layout=config.layout, tp_kind="naive"), 2)
    assert naive.peak_bytes == labkit.estimate_memory(config, 2).peak_bytes > 0


def test_the_engines_part_only_at_the_row_layers_bias(two):
    """Notebook 04: DTensor's RowwiseParallel adds bias / N to each rank's partial sum before
    the all-reduce, the hand-written layer the whole bias after it; without biases the two
    engines train to the same losses bit for bit (with them, to float rounding)."""
    config = labkit.TrainConfig(model=GPTConfig(n_layers=1, bias=False), global_batch=8,
                                steps=3, lr=0.01, layout=labkit.Layout(tp=2))
    dtensor = labkit.train(two, config, estimate=False)
    naive = labkit.train(two, config, tp_kind="naive", estimate=False)
    assert naive.losses == dtensor.losses and len(set(naive.losses)) > 1
