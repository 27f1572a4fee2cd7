"""Bad settings fail where they are written, before anything reaches a rank: every config
field's type and range, and a capacity too small for the model state, with advice that fits
the cause and says what would fit."""

from __future__ import annotations

import numpy as np
import pytest

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig, sized
from labkit.training import TrainConfig
from labkit.training.fit import model_state_note
from labkit.training.run import resolve


@pytest.mark.parametrize("fields, error, words", [
    ({"global_batch": 64.0}, TypeError, "global_batch must be a whole number"),
    ({"steps": 2.5}, TypeError, "steps must be a whole number"),
    ({"steps": 0}, ValueError, "steps must be at least 1"),
    ({"micro_batches": True}, TypeError, "micro_batches"),
    ({"lr": "0.01"}, TypeError, "lr must be a number"),
    ({"lr": float("nan")}, ValueError, "lr must be a finite number 0 or more"),
    ({"lr": -1e-3}, ValueError, "lr must be a finite number 0 or more"),
    ({"seed": -1}, ValueError, "seed must be at least 0"),
    ({"bucket_cap_mb": 0}, ValueError, "bucket_cap_mb"),
    ({"optimizer": "adamm"}, ValueError, "optimizer must be one of"),
    ({"precision": 16}, ValueError, "precision must be one of"),
    ({"strategy": "ddpp"}, ValueError, "strategy must be one of"),
    ({"return_weights": "yes"}, TypeError, "return_weights must be True or False"),
    ({"model": 42}, TypeError, "model must be a zoo config"),
])
def test_train_config_fields_are_checked(fields, error, words):
    with pytest.raises(error, match=words):
        TrainConfig(**fields)


@pytest.mark.parametrize("make, words", [
    (lambda: MLPConfig(d_hidden=0), "MLPConfig.d_hidden must be at least 1"),
    (lambda: MLPConfig(n_layers=2.0), "MLPConfig.n_layers must be a whole number"),
    (lambda: GPTConfig(n_heads=0), "GPTConfig.n_heads must be at least 1"),
    (lambda: GPTConfig(seq_len="64"), "GPTConfig.seq_len must be a whole number"),
    (lambda: DLRMConfig(rows_per_table=0), "DLRMConfig.rows_per_table must be at least 1"),
    (lambda: DLRMConfig(embedding_dim=8.5), "DLRMConfig.embedding_dim"),
])
def test_model_config_fields_are_checked(make, words):
    with pytest.raises((TypeError, ValueError), match=words):
        make()


def test_numpy_numbers_are_taken_as_plain_numbers():
    config = TrainConfig(global_batch=np.int64(32), lr=np.float32(0.01))
    assert type(config.global_batch) is int and type(config.lr) is float
    assert TrainConfig.from_dict(config.to_dict()) == config


def test_bad_fields_never_reach_the_ranks(two):
    two.run(lambda ctx: ctx.state.update(kept=ctx.rank))
    job = two._job_id
    for fields in ({"global_batch": 8.0}, {"lr": "0.1"}, {"steps": 0}):
        with pytest.raises((TypeError, ValueError)):
            labkit.train(two, model="mlp", strategy="ddp", **fields)
    with pytest.raises(ValueError, match="d_hidden"):
        labkit.train(two, model=MLPConfig(d_hidden=0), strategy="ddp")
    assert two._job_id == job  # nothing was sent
    assert two.run(lambda ctx: ctx.state["kept"]) == [0, 1]  # and nothing was lost


def test_a_cap_below_the_model_state_says_what_fits(two):
    """Worked out before the run, said with the (measured) OOM: the weights, gradients and
    Adam's moments need more than the cap, and what would fit instead."""
    model = sized("mlp", 2e6)
    with pytest.raises(labkit.DeviceOOM) as info:
        labkit.train(two, model=model, strategy="ddp", global_batch=8, steps=1,
                     memory_per_device="16MiB")
    text = str(info.value)
    assert info.value.rank in (0, 1) and "Worked out before the run" in text
    assert "What fits" in text and "'fsdp' splits all of it" in text
    assert "activations dominate" not in text
    fsdp = TrainConfig(model=model, strategy="fsdp")
    assert model_state_note(resolve(fsdp, 2), 16 * 2**20) is None
    note = model_state_note(resolve(fsdp, 1), 16 * 2**20)
    assert "optimizer 15.3 MiB" in note and "needs at least 2 ranks" in note


def test_an_oom_while_the_model_is_built_blames_the_weights(two):
    """Strategies that split unevenly (pipelines) are not checked up front: the rank finds
    out while building, and says the weights do not fit, not that activations dominate."""
    with pytest.raises(labkit.DeviceOOM) as info:
        labkit.train(two, model=sized("mlp", 2e6), strategy="gpipe", global_batch=8, steps=1,
                     memory_per_device="2MiB")
    error = info.value
    assert error.category == "parameters"
    assert "weights alone do not fit" in str(error)
    assert "activations dominate" not in str(error)


def test_train_puts_back_only_a_cap_it_changed():
    """A widget thread's run (no cap of its own) that starts while a cell's run has lifted
    the cap (memory_per_device=None) must not put that lifted cap back afterwards: the cell's
    run restores the cluster's cap while the widget's waits for the cluster."""

    class Shared:  # the cluster as the widget's thread sees it
        world_size, device, backend = 2, "cpu", "gloo"
        memory_per_device = None  # lifted by the cell's run, in progress

        def run(self, *args, **kwargs):
            self.memory_per_device = 32 * 2**20  # the cell's run ended and put its cap back
            raise RuntimeError("the widget's run")

    cluster = Shared()
    with pytest.raises(RuntimeError, match="the widget's run"):
        labkit.train(cluster, model=MLPConfig(d_hidden=64), strategy="ddp", estimate=False)
    assert cluster.memory_per_device == 32 * 2**20
