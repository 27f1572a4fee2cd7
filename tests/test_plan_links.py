"""What the planner charges beside the matmuls, figure by figure: the rate NCCL reaches on a
node's GPU links (nccl-tests busbw), when a framework reduces FSDP's gradients, and the
published runs' rebuilt shapes against their published parameter counts."""

from __future__ import annotations

import pytest

import labkit.plan as plan
from labkit.models import GPTConfig
from labkit.plan.hardware import GPUS, NIC_EFFICIENCY
from labkit.plan.parallelism import Parallelism

SMALL = GPTConfig(vocab_size=32000, seq_len=1024, d_model=1024, n_heads=8, n_layers=4)


def test_in_node_collectives_run_at_nccls_measured_bus_bandwidth():
    # Bekman's nccl-tests on 8 H200s (NVLink 4): ring all-gather 361.4 GB/s, reduce-scatter
    # 362.9, all-reduce 367.2, a pairwise copy 396.4; on 8 A100s (NVLink 3) all-reduce 234.89
    h100, a100 = GPUS["H100"], GPUS["A100-80GB"]
    assert h100.achieved_bandwidth(8, "all_gather") == pytest.approx(361.4e9)
    assert h100.achieved_bandwidth(8, "reduce_scatter") == pytest.approx(362.9e9)
    assert h100.achieved_bandwidth(8, "all_reduce") == pytest.approx(367.2e9)
    assert h100.achieved_bandwidth(2, "send") == pytest.approx(396.4e9)
    # a kind a row has no measurement of takes its ring all-reduce's fraction
    assert a100.achieved_bandwidth(2, "send") == pytest.approx(234.89e9)
    assert GPUS["L4"].achieved_bandwidth(8, "all_reduce") == GPUS["L4"].group_bandwidth(
        8, "all_reduce")  # no measurement: the datasheet's rate
    node = plan.GPUCluster("H100")
    assert node.link(False, 8, "all_gather")[1] == pytest.approx(361.4e9)
    two = plan.GPUCluster("H100", nodes=2)
    assert two.link(True, 16, "all_gather")[1] == pytest.approx(  # one NIC, as NCCL reaches it
        50e9 * NIC_EFFICIENCY)


def test_an_all_reduce_over_four_b200_nodes_takes_the_time_nccl_measured():
    # Bekman's all_reduce_bench.py on 4 P6-B200 nodes (8 GPUs, 8x 50 GB/s EFA each), NCCL
    # 2.27.7: busbw 377.34 GB/s at 4 GiB, i.e. 4 GiB x 2 x 31/32 / 377.34 GB/s = 22.05 ms. The
    # figure the planner charges comes from the 16 GiB row (381.80), so the 4 GiB row checks it;
    # the README's one-NIC arithmetic (85.9 ms) is 3.9x off
    cluster = plan.GPUCluster("B200", nodes=4)
    nbytes = 4 * 2**30
    alpha, bandwidth = cluster.link(True, 32, "all_reduce", per_node=8)  # a ring on 8 NICs
    t = 2 * 31 * alpha + 2 * 31 / 32 * nbytes / bandwidth  # what project charges one call
    measured = nbytes * 2 * 31 / 32 / 377.34e9
    assert measured == pytest.approx(22.05e-3, rel=1e-3)
    assert t == pytest.approx(measured, rel=0.06)
    assert NIC_EFFICIENCY == pytest.approx(381.80 / 400)


def test_composer_reduce_scatters_after_every_micro_batch_labkit_once():
    layout, node = Parallelism.of(fsdp=8, dp_kind="fsdp"), plan.GPUCluster("H100")
    kw = dict(global_batch=64, micro_batches=4, flash_attention=True)
    once = plan.project(SMALL, layout, node, framework="labkit", **kw)
    every = plan.project(SMALL, layout, node, framework="composer", **kw)
    calls, nbytes = once.costs.comm[("fsdp", "reduce_scatter")]
    assert calls == SMALL.n_layers + 1  # each block and the root, once a step
    assert every.costs.comm[("fsdp", "reduce_scatter")] == (4 * calls, pytest.approx(4 * nbytes))
    assert every.costs.comm[("fsdp", "all_gather")] == once.costs.comm[("fsdp", "all_gather")]


def test_mpt_rebuilds_hold_the_published_parameter_counts():
    # llm-foundry's table: NumParams of MPT 1B and 7B (biases, learned positions, tied head)
    from labkit.plan.counts import sample_counts
    from labkit.plan.published import run

    for name, published in (("mpt_1b_8gpu", 1315950592), ("mpt_7b_8gpu", 6658859008)):
        assert sample_counts(run(name).model).params == published, name


def test_a_reduction_once_a_step_hides_under_the_last_micro_batchs_backward_only():
    # Megatron-Core registers gradients ready "when processing the last microbatch" and
    # gathers the distributed optimizer's parameters under the next step's first forward:
    # 2 nodes x 8 H100s, dp over the network, the same step in 1 or 8 micro-batches
    from labkit.plan.hardware import OVERLAP_SLOWDOWN
    from labkit.plan.project import _busy_s, _compute_s

    model = GPTConfig(vocab_size=32000, seq_len=2048, d_model=2048, n_heads=16, n_layers=8)
    layout, cluster = Parallelism.of(dp=16), plan.GPUCluster("H100", nodes=2)
    kw = dict(global_batch=128, zero_stage=1, framework="megatron-core")
    one = plan.project(model, layout, cluster, micro_batches=1, **kw)
    eight = plan.project(model, layout, cluster, micro_batches=8, **kw)
    by_kind = _busy_s(layout, cluster, eight.lever, eight.costs)[3]
    compute = _compute_s(model, layout, cluster, eight.lever, eight.costs)  # no slowdown
    rs, ag = by_kind[("dp", "reduce_scatter")], by_kind[("dp", "all_gather")]
    assert rs > compute * 2 / 3 / 8 and ag > compute / 3 / 8  # each outlasts its window
    assert eight.exposed_s["dp"] == pytest.approx(
        (rs - compute * 2 / 3 / 8) + (ag - compute / 3 / 8))
    # what hid (a window's worth each) slowed the compute beside it
    assert eight.compute_s == pytest.approx(compute * (1 + OVERLAP_SLOWDOWN / 8))
    assert eight.exposed_s["dp"] > 5 * one.exposed_s["dp"]
    # FSDP: gathers in every micro-batch (under all of it); a reduce-scatter once a step
    # (torch's no_sync) under the last backward, Composer's after every micro-batch under each
    from labkit.plan.levers import Lever
    from labkit.plan.overlap import hiding_window_s

    for name, window in (("labkit", 2 / 3 / 8), ("composer", 2 / 3)):
        lever = Lever(128, 8, framework=name)
        assert hiding_window_s("fsdp", "reduce_scatter", lever, 1.0) == pytest.approx(window)
        assert hiding_window_s("fsdp", "all_gather", lever, 1.0) == 1.0
        assert hiding_window_s("fsdp", "all_gather", lever, 1.0, pipelined=True) == 1.0
        assert hiding_window_s("dp", "all_reduce", lever, 1.0) == pytest.approx(2 / 3 / 8)
    kept = Lever(128, 8, framework="llama3")  # gathered to backward: under the forwards;
    assert hiding_window_s("fsdp", "all_gather", kept, 1.0) == pytest.approx(1 / 3)
    assert hiding_window_s("fsdp", "all_gather", kept, 1.0, pipelined=True) == pytest.approx(
        1 / 3 / 8)  # in a pipeline once a step, under the first micro-batch's


def test_the_loss_moves_fp32_logits_whatever_the_compute_dtype(monkeypatch):
    # Megatron's cross entropy casts the logits (.float()), torchtitan's loss_fn too, and
    # autocast runs log_softmax and nll_loss in fp32: under mixed precision the loss's ops
    # are charged as counted (fp32), not halved, plus the casts (12 bytes a logit)
    import dataclasses

    import labkit.plan.traffic as traffic
    from labkit.plan.counts import sample_counts
    from labkit.plan.levers import Lever

    model = GPTConfig(vocab_size=32000, seq_len=1024, d_model=512, n_heads=8, n_layers=2)
    counts = sample_counts(model)
    logits = model.seq_len * model.vocab_size
    assert counts.logits_bytes >= 4 * 4 * logits  # softmax forward and backward, in fp32
    assert counts.logits_bytes < counts.other_bytes
    layout, lever = Parallelism.of(), Lever(8, precision="mixed")
    fp32 = Lever(8, precision="fp32")  # counted in fp32 already: unchanged
    charged = traffic.memory_bound_bytes(model, layout, lever, 0.0)
    charged_fp32 = traffic.memory_bound_bytes(model, layout, fp32, 0.0)
    monkeypatch.setattr(traffic, "sample_counts",
                        lambda m: dataclasses.replace(counts, logits_bytes=0.0))
    halved = traffic.memory_bound_bytes(model, layout, lever, 0.0)
    assert charged - halved == pytest.approx(8 * (counts.logits_bytes / 2 + 12 * logits))
    assert traffic.memory_bound_bytes(model, layout, fp32, 0.0) == charged_fp32
