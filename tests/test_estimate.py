"""The estimator against measurement, the ZeRO paper, and models too big to build."""

from __future__ import annotations

import psutil
import pytest

import labkit
from labkit.models import BIG_DECODERS, DLRMConfig, GPTConfig, MLPConfig, count_parameters
from labkit.runtime.memory.oom import CATEGORIES
from labkit.training.estimate import model_state_bytes

ZOO = [MLPConfig(d_hidden=384), GPTConfig(), DLRMConfig(rows_per_table=4000)]


def _check(report):
    for rank in report.ranks:
        memory = rank["memory"]
        parts = sum(memory["at_peak"][c] for c in CATEGORIES)
        assert parts == memory["peak_bytes"] == memory["at_peak"]["total"]  # sums to the peak
    assert report.estimate_error() < 0.10, (report.peak_bytes, report.estimate)


@pytest.mark.parametrize("model", ZOO, ids=lambda m: m.name)
@pytest.mark.parametrize("precision, optimizer", [("fp32", "adam"), ("mixed", "adamw"),
                                                  ("bf16", "sgd")])
def test_estimate_matches_single_device_measurement(one, model, precision, optimizer):
    _check(labkit.train(one, model=model, global_batch=16, steps=3, precision=precision,
                        optimizer=optimizer))


@pytest.mark.parametrize("model", ZOO, ids=lambda m: m.name)
@pytest.mark.parametrize("strategy", ["naive_dp", "ddp"])
def test_estimate_matches_data_parallel_measurement(two, model, strategy):
    _check(labkit.train(two, model=model, strategy=strategy, global_batch=16, steps=3))


def test_peak_phase_follows_the_step(one):
    adam = labkit.train(one, model=MLPConfig(d_hidden=512), global_batch=8, steps=2)
    assert adam.ranks[0]["memory"]["peak_phase"] == "optimizer"  # Adam's lazily made state
    big_batch = labkit.train(one, model=GPTConfig(), global_batch=32, steps=2, optimizer="sgd")
    assert big_batch.ranks[0]["memory"]["peak_phase"] == "backward"


def test_training_twice_does_not_leak_the_first_model(one):
    first = labkit.train(one, model=MLPConfig(), global_batch=8, steps=2, estimate=False)
    second = labkit.train(one, model=MLPConfig(), global_batch=8, steps=2, estimate=False)
    assert second.peak_bytes == first.peak_bytes


def test_zero_paper_model_states_for_7_5b_on_64_devices():
    # Rajbhandari et al. 2020, Figure 1: 120 GB; 31.4, 16.6, 1.9 GB for stages 1, 2, 3.
    expected = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
    for stage, gigabytes in expected.items():
        total = model_state_bytes(7.5e9, world_size=64, zero_stage=stage)["total"]
        assert round(total / 1e9, 1) == gigabytes


def test_7b_decoder_is_estimated_without_allocating_it():
    config = labkit.TrainConfig(model=BIG_DECODERS["7B"], global_batch=1, optimizer="adam")
    rss_before = psutil.Process().memory_info().rss
    estimate = labkit.estimate_memory(config)
    assert psutil.Process().memory_info().rss - rss_before < 2**30
    n = count_parameters(BIG_DECODERS["7B"])
    assert 6.5e9 < n < 7.0e9
    # fp32 Adam: weights and gradients 4 bytes each per parameter, Adam's moments 8 at least.
    assert estimate.at_peak["parameters"] == 4 * n
    assert estimate.at_peak["optimizer"] >= 8 * n
    analytic = model_state_bytes(n, precision="fp32")["total"]
    assert analytic <= estimate.peak_bytes < 1.1 * analytic
    assert not estimate.fits(80 * 10**9)


def test_every_strategy_is_traced_the_pipelines_stage_by_stage():
    """No strategy is refused any more: each is built on a fake process group by the same
    build path as training; a pipeline's stages (and a table group's ranks) one by one."""
    for strategy in labkit.STRATEGIES:
        tables = strategy in ("table_wise", "row_wise", "row_wise_dtensor")
        model = DLRMConfig() if tables else MLPConfig()
        world_size = 1 if strategy == "single" else 2
        config = labkit.TrainConfig(model=model, strategy=strategy,
                                    micro_batches=1 if strategy == "naive_pipeline" else 2)
        estimate = labkit.estimate_memory(config, world_size)
        assert estimate.peak_bytes == sum(estimate.at_peak.values()) > 0, strategy
        pipelined = strategy in ("naive_pipeline", "gpipe", "1f1b", "interleaved_1f1b")
        assert len(estimate.per_rank) == (2 if pipelined or tables else 1), strategy
        assert estimate.peak_bytes == max(estimate.per_rank.values())
