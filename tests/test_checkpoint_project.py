"""The checkpoint trade-off projected to named clusters (labkit.lessons.checkpoints.project),
against values computed by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

import labkit
from labkit.lessons.checkpoints.project import LLAMA3_STORAGE, Storage, project_tradeoff, tradeoff


def _projection(parameters: float, optimizer: float, gpus: int, step_s: float):
    memory = {"parameters": parameters, "optimizer": optimizer, "activations": 5e9}
    return SimpleNamespace(costs=SimpleNamespace(memory=memory), cluster="c",
                           layout=SimpleNamespace(size=gpus), step_s=step_s)


def test_the_trade_off_matches_a_hand_computation():
    # 1 GB of weights + 2 GB of optimizer state per GPU at 100 MB/s: C = 30 s.
    # 8 GPUs, one GPU's MTBF 800 h: the job's M = 100 h = 360,000 s.
    # Young/Daly: sqrt(2 x 30 x 360,000) = sqrt(21.6e6) = 4647.58 s = 2324 steps of 2 s.
    # First order, C/T + T/2M = 0.006455 + 0.006455 = 0.01291; Daly's exact expectation
    # M (e^((T+C)/M) - 1) / T - 1 = 0.01302 (a little more: failures during saves).
    t = tradeoff(_projection(1e9, 2e9, 8, 2.0), Storage("disk", 1e8, "assumed"),
                 gpu_mtbf_s=800 * 3600)
    assert t.checkpoint_bytes_per_gpu == 3e9 and t.save_s == pytest.approx(30.0)
    assert t.mtbf_s == pytest.approx(360_000) and t.interval_s == pytest.approx(4647.58, abs=0.01)
    assert t.interval_steps == 2324
    assert t.overhead == pytest.approx(0.01302, abs=2e-5) and t.overhead > 0.01291


def test_llama3_storage_and_failure_rate_are_the_defaults():
    # 2 TB/s over 16,384 GPUs: 122.07 MB/s each. 419 unexpected interruptions in 54 days on
    # 16,384 GPUs: one GPU every 54 x 24 / 419 x 16,384 = 50,675 h.
    assert LLAMA3_STORAGE.write_bytes_per_s_per_gpu == pytest.approx(122.07e6, rel=1e-4)
    t = tradeoff(_projection(61.035e6, 61.035e6, 16384, 1.0))
    assert t.save_s == pytest.approx(1.0, rel=1e-4)
    assert t.mtbf_s == pytest.approx(54 * 24 * 3600 / 419, rel=1e-9)
    assert t.interval_s == pytest.approx(math.sqrt(2 * 1.0 * 54 * 24 * 3600 / 419), rel=1e-4)


def test_a_named_cluster_takes_its_bytes_and_step_from_the_planner():
    from labkit.models import GPT_7B
    from labkit.plan import GPUCluster, project

    layout, cluster = labkit.Layout(fsdp=8), GPUCluster("H100")
    t = project_tradeoff(GPT_7B, layout, cluster, global_batch=64)
    p = project(GPT_7B, layout, cluster, global_batch=64)
    assert t.checkpoint_bytes_per_gpu == p.costs.memory["parameters"] + p.costs.memory[
        "optimizer"] and t.step_s == p.step_s and t.gpus == 8
    half = project_tradeoff(GPT_7B, labkit.Layout(fsdp=16), GPUCluster("H100", nodes=2), 64)
    # twice the GPUs: half the state each (C halves), the job fails twice as often
    assert half.save_s == pytest.approx(t.save_s / 2, rel=0.01)
    assert half.mtbf_s == pytest.approx(t.mtbf_s / 2)


def test_storage_without_bandwidth_is_refused():
    with pytest.raises(ValueError, match="positive write bandwidth"):
        tradeoff(_projection(1e9, 1e9, 8, 1.0), Storage("none", 0.0, "?"))
