"""labkit.plan's model against the textbook, one test per defect a review found: latency per
ring step, usable memory (GiB, headroom), pure bf16 ranked last with a caveat, mixed precision's
gradients the same on the wire as in memory, nodes no bigger than their links, MI300X's links
one per peer, calibration's memory from the machine, and TP's recomputed AllReduces."""

from __future__ import annotations

import dataclasses

import pytest

import labkit.plan as plan
from labkit.models import GPT_7B, GPTConfig
from labkit.plan.hardware import GiB, MiB
from labkit.plan.parallelism import Parallelism
from labkit.plan.project import step_costs
from labkit.plan.step import Lever, local_params, step_comm
from labkit.runtime.comm import AlphaBeta, fit_alpha_beta
from labkit.runtime.costs import collective_seconds, ring_steps
from labkit.training.layout import Layout

SMALL = GPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=2)


def test_ring_latency_is_paid_per_step():
    assert [ring_steps("all_reduce", n) for n in (1, 2, 16)] == [0, 2, 30]
    assert ring_steps("all_gather", 16) == ring_steps("reduce_scatter", 16) == 15
    # 2(N-1) alpha + 2(N-1)/N bytes / beta: 16 ranks, 1 GB at 50 GB/s, 20 us a step
    assert collective_seconds("all_reduce", 1e9, 16, 20e-6, 50e9) == pytest.approx(
        30 * 20e-6 + 2 * 15 / 16 * 1e9 / 50e9)
    # a fit on 2 ranks knows its intercept is 2 steps; on 8 ranks the same link pays 14
    fit = fit_alpha_beta("all_reduce", 2, [1 << 10, 1 << 20], [2e-4 + 1e-9 * (1 << 10),
                                                             2e-4 + 1e-9 * (1 << 20)])
    assert fit.latency_per_step == pytest.approx(1e-4, rel=1e-6)
    assert fit.on_group(8).alpha_s == pytest.approx(14e-4, rel=1e-6)
    assert AlphaBeta("send", 2, 5e-5, 1e9).latency_per_step == 5e-5


def test_projected_data_parallel_latency_grows_with_ranks():
    # a 7B's gradients over dp=16 on two nodes: the textbook 2(N-1) alpha per AllReduce call
    cluster = plan.GPUCluster("H100", nodes=2)
    p = plan.project(GPT_7B, Layout(dp=16), cluster, global_batch=16)
    calls, nbytes = p.costs.comm[("dp", "all_reduce")]
    alpha, bandwidth = cluster.link(True, 16, "all_reduce", per_node=8)  # 8 NICs a node
    assert p.comm_s["dp"] == pytest.approx(calls * 30 * alpha + 2 * 15 / 16 * nbytes / bandwidth)


def test_memory_is_read_in_gib_with_headroom():
    h100 = plan.GPUCluster("H100").gpu
    assert h100.memory_bytes == 81559 * MiB  # the driver's total, ~85.5e9 bytes, not 80e9
    assert plan.GPUCluster("MI300X").gpu.memory_bytes == 192 * GiB
    usable = h100.usable_memory_bytes
    assert usable == pytest.approx(h100.memory_bytes * 0.95 - 2 * GiB)
    assert usable < 80e9  # a layout needing 79.99 "GB" is not called fitting
    for name, row in plan.GPUS.items():
        assert 0 < row.usable_memory_bytes < row.memory_bytes, name


def test_pure_bf16_ranks_after_mixed_with_a_caveat():
    found = plan.search(GPT_7B, plan.GPUCluster("H100", nodes=1), global_batch=64)
    precisions = [p.lever.precision for p in found.fits]
    assert precisions[0] == "mixed" and "bf16" in precisions
    assert precisions.index("bf16") > max(i for i, x in enumerate(precisions) if x == "mixed")
    bf16 = next(p for p in found.fits if p.lever.precision == "bf16")
    assert "convergence" in bf16.caveats[0] and "caveat" in bf16._repr_html_()
    assert found.best.caveats == () and bf16.summary()["caveats"]


def test_mixed_gradients_are_fp32_in_memory_and_on_the_wire():
    layout, lever = Parallelism.of(dp=8), Lever(8, 1, "mixed")
    costs = step_costs(SMALL, layout, lever)
    params = local_params(SMALL, layout)
    assert costs.memory["gradients"] == pytest.approx(4 * params)  # fp32, as labkit trains
    assert costs.comm[("dp", "all_reduce")][1] == pytest.approx(costs.memory["gradients"])
    bf16 = step_costs(SMALL, layout, Lever(8, 1, "bf16"))
    assert bf16.comm[("dp", "all_reduce")][1] == pytest.approx(bf16.memory["gradients"])


def test_a_node_bigger_than_its_links_is_refused():
    with pytest.raises(ValueError, match="at most 8 GPUs"):
        plan.GPUCluster("H100", gpus_per_node=16)
    assert plan.GPUCluster("H100", gpus_per_node=16, custom_node=True).world_size == 16


def test_mi300x_reaches_one_peer_over_one_link():
    gpu = plan.GPUCluster("MI300X").gpu
    assert gpu.group_bandwidth(2, "send") == gpu.group_bandwidth(2, "all_reduce") == 64e9
    assert gpu.group_bandwidth(8, "all_reduce") == 7 * 64e9
    h100 = plan.GPUCluster("H100").gpu
    assert h100.group_bandwidth(2, "send") == h100.group_bandwidth(8, "all_reduce") == 450e9


def test_calibration_memory_without_a_cap_is_the_machines():
    import os

    from labkit.plan.calibrate import _host_memory_per_rank

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert _host_memory_per_rank(2) == total / 2 and total / 2 != 1 << 30


def test_tensor_parallel_recompute_all_reduces_are_counted():
    layout = Parallelism.of(tp=2)
    plain, ckpt = (step_comm(SMALL, layout, Lever(8, 1, "fp32", ac), local_params(SMALL, layout))
                   for ac in (False, True))
    calls, nbytes = plain[("tp", "all_reduce")]
    # backward's recompute reruns a block's attention AllReduce (its MLP's is not needed:
    # checkpoint stops early); each is d_model wide like the others: 4 per block become 5
    assert ckpt[("tp", "all_reduce")][0] == calls * 5 // 4
    assert ckpt[("tp", "all_reduce")][1] == pytest.approx(nbytes * 5 / 4)
    big = plan.project(GPT_7B, Layout(fsdp=4, tp=8), plan.GPUCluster("H100", nodes=4),
                       global_batch=32, activation_checkpointing=True)
    assert big.costs.comm[("tp", "all_reduce")][0] == 5 * GPT_7B.n_layers


# ----- cp and ep: counted bytes equal a measured run's ---------------------------------------
def test_cp_and_ep_bytes_equal_a_measured_run():
    import labkit
    from labkit.models.moe import MoEGPTConfig

    moe = MoEGPTConfig(vocab_size=256, seq_len=32, d_model=64, n_heads=4, n_layers=2)
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        for model, layout in ((SMALL, Parallelism.of(cp=2)), (moe, Parallelism.of(dp=2, ep=2))):
            report = labkit.train(cluster, model=model, **layout.config_fields(), global_batch=8,
                                  steps=2, optimizer="sgd", estimate=False)
            measured = {(dim, kind): (c["calls"], c["bytes"])
                        for dim, kinds in report.comm_by_dim().items()
                        for kind, c in kinds.items() if kind != "recv"}
            counted = step_comm(model, layout, Lever(8, 1, "fp32", optimizer="sgd"),
                                local_params(model, layout))
            assert {k: (round(c), round(b)) for k, (c, b) in counted.items()} == measured, (
                layout)


def test_cp_beside_tp_rings_each_tp_ranks_heads():
    """cp x tp as Megatron-Core runs it (labkit's engines train cp with dp and fsdp only, so
    no measured run to hold it to): a tp rank rings its own heads' keys and values, and tp's
    AllReduces carry a cp rank's share of each sequence. Against layouts of the same
    samples per rank: dp x cp (the same ring of whole heads) and dp x tp (whole sequences)."""
    long = GPTConfig(vocab_size=256, seq_len=4096, d_model=256, n_heads=4, n_layers=2)
    node = plan.GPUCluster("H100", gpus_per_node=4)
    both = plan.project(long, Layout(cp=2, tp=2), node, global_batch=4)
    ring = plan.project(long, Layout(dp=2, cp=2), node, global_batch=8)
    split = plan.project(long, Layout(dp=2, tp=2), node, global_batch=8)
    assert both.costs.comm[("cp", "send")][1] == ring.costs.comm[("cp", "send")][1] / 2
    assert both.costs.comm[("tp", "all_reduce")][1] == split.costs.comm[("tp", "all_reduce")][1] / 2
    assert both.costs.memory["activations"] == pytest.approx(
        split.costs.memory["activations"] / 2, rel=0.01)
    found = plan.search(long, node, global_batch=4, cp=(2,))
    assert any(p.layout.cp > 1 and p.layout.tp > 1 for p in found.fits)


def test_fp16_keeps_the_mixed_state_and_unscales_the_gradients_once():
    cluster = plan.GPUCluster("A100-80GB", nodes=2)
    model = GPTConfig(vocab_size=32000, seq_len=2048, d_model=2048, n_heads=16, n_layers=8)
    mixed = plan.project(model, Layout(fsdp=16), cluster, 64)
    fp16 = plan.project(model, Layout(fsdp=16), cluster, 64, precision="fp16")
    assert fp16.costs.memory == mixed.costs.memory and fp16.costs.comm == mixed.costs.comm
    extra = fp16.costs.memory_bound_bytes - mixed.costs.memory_bound_bytes
    assert extra == 2 * mixed.costs.memory["gradients"] > 0  # read and written once
    assert fp16.caveats and "loss scaling" in fp16.caveats[0] and not mixed.caveats


def test_cp_and_ep_in_projection_and_search():
    from labkit.models.moe import MoEGPTConfig

    long = GPTConfig(vocab_size=256, seq_len=4096, d_model=256, n_heads=4, n_layers=2)
    node = plan.GPUCluster("H100", gpus_per_node=4)
    # the same 2 data ranks, each sequence over 1 rank, then over a cp group of 2
    one = plan.project(long, Layout(dp=2), plan.GPUCluster("H100", gpus_per_node=2), global_batch=4)
    ring = plan.project(long, Layout(dp=2, cp=2), node, global_batch=4)
    assert ring.costs.memory["activations"] < 0.6 * one.costs.memory["activations"]
    assert ring.links["cp"] == "in-node" and ring.exposed_s["cp"] > 0
    with pytest.raises(plan.PlanError, match="not with pp"):
        plan.project(long, Parallelism.of(cp=2, pp=2, schedule="1f1b"), node, global_batch=4,
                     micro_batches=2)
    moe = MoEGPTConfig(vocab_size=256, seq_len=64, d_model=128, n_heads=4, n_layers=2,
                       n_experts=4)
    ep = plan.project(moe, Layout(dp=4, ep=4), node, global_batch=8)
    dense = plan.project(moe, Layout(dp=4), node, global_batch=8)
    assert ep.costs.memory["parameters"] < dense.costs.memory["parameters"]
    assert ep.comm_s["dp"] > 0 and ep.exposed_s["dp"] >= ep.comm_s["dp"] * 0.5
    with pytest.raises(plan.PlanError, match="divide the 6 experts"):
        plan.project(dataclasses.replace(moe, n_experts=6), Layout(dp=4, ep=4), node,
                     global_batch=8)
    with pytest.raises(plan.PlanError, match="has none"):
        plan.project(long, Layout(dp=4, ep=4), node, global_batch=8)
    found = plan.search(long, node, global_batch=4, cp=(1, 2, 4))
    assert any(p.layout.cp > 1 for p in found.fits)
    assert any(p.layout.ep > 1 for p in plan.search(moe, node, global_batch=8).fits)


def test_ranks_over_cores_share_them_and_other_load_is_measured_not_guessed():
    from labkit.lessons.planning.checkrun import load_factor
    from labkit.plan.calibrate import Calibration

    alone = Calibration(2, 1e11, 1e10, 2e-5, 1e9, cores=2)
    crowded = Calibration(4, 1e11, 1e10, 2e-5, 1e9, cores=2)
    assert alone.core_share == 1 and crowded.core_share == 2
    assert crowded.cluster().gpu.bf16_flops == alone.cluster().gpu.bf16_flops / 2
    assert crowded.cluster().op_overhead_s == 2 * alone.cluster().op_overhead_s
    # a rank that waited for a core 3/4 of a 4 s run ran 4x slower than on a core of its own;
    # the ranks' own sharing (2 ranks a core) explains half of that
    one_step = [[(4.0, 3.0), (4.0, 1.0)]]  # [step][rank]: (wall, waited)
    assert load_factor(one_step, 1.0, "slowest") == pytest.approx(4.0)
    assert load_factor(one_step, 2.0, "slowest") == pytest.approx(2.0)
    assert load_factor([[(4.0, 0.0), (4.0, 0.0)]], 1.0) == 1.0
    # a step waits for its slowest rank: rank 0 held up step 0 (4x), rank 1 step 1 (2x);
    # per step that is a median of 2x, while each rank over the whole run waited little
    steps = [[(4.0, 3.0), (4.0, 0.0)], [(4.0, 0.0), (4.0, 2.0)], [(4.0, 0.0), (4.0, 0.0)]]
    assert load_factor(steps, 1.0, "step") == pytest.approx(2.0)
    assert load_factor(steps, 1.0, "slowest") == pytest.approx(12 / 9)
    assert load_factor(steps, 1.0, "median") == pytest.approx((12 / 9 + 12 / 10) / 2)


def test_engine_overhead_is_measured_positive_and_charged_only_to_tp_and_fsdp(two):
    """DTensor's dispatch and FSDP2's hooks, measured on a tiny decoder on two ranks (CPU
    time, not the runs the bench compares), are a cost per parameter tensor; a projection
    pays it only for the engines its layout uses."""
    from labkit.lessons.planning.checkrun import _GPT
    from labkit.plan.calibrate import Calibration
    from labkit.plan.counts import param_tensors
    from labkit.plan.engines import engine_runs, fit_overhead, measure_engine_overhead

    runs = engine_runs(2, two.device, two.backend)  # resolved here, not on the ranks
    fitted = fit_overhead(two.run(measure_engine_overhead, runs, 3))
    assert set(fitted) == {"tp", "fsdp"}
    assert all(per_tensor > 0 and per_byte >= 0 for per_tensor, per_byte in fitted.values())
    plain = Calibration(2, 1e11, 1e10, 2e-5, 1e9, cores=2)
    measured = dataclasses.replace(plain, engine_overhead=fitted)

    def step(calibration, layout):
        return plan.project(_GPT, layout, calibration.cluster(), global_batch=16,
                            micro_batches=2 if layout.pp > 1 else 1, precision="fp32").step_s

    tensors = param_tensors(_GPT)
    for layout, engines in ((Layout(tp=2), ("tp",)), (Layout(fsdp=2), ("fsdp",)),
                            (Parallelism.of(dp=2, dp_kind="ddp"), ()),
                            (Parallelism.of(pp=2, schedule="gpipe"), ())):
        extra = step(measured, layout) - step(plain, layout)
        want = sum(fitted[e][0] for e in engines) * tensors
        assert extra == pytest.approx(want, rel=1e-6, abs=1e-12), layout
    # GPUs have no such figure: a named cluster pays nothing
    assert plan.GPUCluster("H100").engine_overhead_s == ()


def test_the_measured_step_is_the_steady_one_past_the_warm_up():
    """A CPU rank's steps keep getting faster for a few steps; the projection is of the
    steady step, so the measured one is the median of the later half of the timed steps."""
    from types import SimpleNamespace

    from labkit.lessons.planning.checkrun import steady_step_s, steady_steps

    def report(times):  # two ranks; rank 1 is 1 ms slower at every step
        return SimpleNamespace(ranks=[{"records": [{"step_s": t + r * 1e-3} for t in times]}
                                      for r in range(2)])

    warming = report([0.5, 0.181, 0.137, 0.113, 0.104, 0.096, 0.092, 0.091, 0.088, 0.089])
    assert steady_steps(warming) == [5, 6, 7, 8, 9]  # step 0 (set-up) and the warm-up out
    assert steady_step_s(warming) == pytest.approx(0.091 + 1e-3)  # the slowest rank's
    assert steady_steps(report([0.5, 0.2, 0.1])) == [1, 2]  # too few: every timed step


def test_on_this_machine_communication_is_exposed_whole_and_the_optimizer_counted():
    """A CPU rank's collectives run on gloo's threads on its one core: no overlap credit on
    a measured cluster (labkit's own split measures comm_s = comm_busy_s), while GPUs keep
    it. The optimizer's bandwidth-bound bytes are counted on its ops: torch's Adam touches
    19 parameter-sized arrays per step (lerp 3, mul 2, addcmul 4, sqrt 2, div 2, add 2,
    addcdiv 4), SGD 3 (add: the parameter, the gradient, the result)."""
    from labkit.lessons.planning.checkrun import _GPT
    from labkit.plan.calibrate import Calibration
    from labkit.plan.counts import optimizer_counts

    assert optimizer_counts("adam")[0] == pytest.approx(19, rel=1e-3)
    assert optimizer_counts("sgd")[0] == pytest.approx(3, rel=1e-3)
    from labkit.runtime.comm.alpha_beta import AlphaBeta

    links = {k: AlphaBeta(k, 2, 4e-4, 1e9) for k in ("all_reduce", "all_gather",
                                                      "reduce_scatter")}
    here = Calibration(2, 1e11, 1e10, 2e-5, 1e9, links, cores=2).cluster()
    fsdp = plan.project(_GPT, Layout(fsdp=2), here, global_batch=16, precision="fp32")
    assert fsdp.exposed_s["fsdp"] == fsdp.comm_s["fsdp"] > 0
    gpus = plan.project(_GPT, Layout(fsdp=2), plan.GPUCluster("H100", gpus_per_node=2),
                        global_batch=16, precision="fp32")
    assert gpus.exposed_s["fsdp"] < gpus.comm_s["fsdp"]
    one = Calibration(1, 1e11, 1e10, 2e-5, 1e9, cores=2).cluster()
    sgd = plan.project(_GPT, Layout(), one, global_batch=16, precision="fp32", optimizer="sgd")
    adam = plan.project(_GPT, Layout(), one, global_batch=16, precision="fp32")
    assert adam.costs.memory_bound_bytes - sgd.costs.memory_bound_bytes == pytest.approx(
        16 * adam.costs.memory["parameters"], rel=1e-3)


def test_ops_charged_per_step_are_the_ops_a_cpu_step_dispatches():
    """The per-op cost is charged on the ops a real step dispatches: on meta tensors
    attention takes the math path (bmm, mask, softmax: +38% of the GPT's forward and
    backward ops), a CPU runs one fused kernel each way. Counted here on a real CPU step
    (labkit's ``run_step``, Adam) with 1 and 2 micro-batches."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from labkit.models import build_model, example_batch, loss_fn
    from labkit.models.optim import make_optimizer
    from labkit.plan.project import _ops
    from labkit.training.step.spmd import run_step

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    for micro in (1, 2):
        torch.manual_seed(0)
        model = build_model(SMALL)
        optimizer = make_optimizer("adam", model.parameters(), 1e-3)
        batch = example_batch(SMALL, 4)
        run_step(model, batch, loss_fn(SMALL), optimizer, "fp32", micro_batches=micro)
        Count.n = 0
        with Count():  # the second step: Adam's state exists, as in every later step
            run_step(model, batch, loss_fn(SMALL), optimizer, "fp32", micro_batches=micro)
        charged = _ops(SMALL, Parallelism.of(), Lever(4, micro, "fp32", False, "adam"))
        assert charged == pytest.approx(Count.n, rel=0.03), micro


def test_time_to_train_and_calibrate_refuse_nonsense_before_any_work():
    proj = plan.project(SMALL, Layout(dp=8), plan.GPUCluster("H100"), global_batch=16)
    for bad in ({"tokens": -5}, {"samples": float("nan")}, {"tokens": float("inf")}):
        with pytest.raises(ValueError, match="a number of"):
            proj.time_to_train(**bad)
    with pytest.raises(TypeError, match="labkit.Cluster"):
        plan.calibrate("nonsense")
    with pytest.raises(ValueError, match="repeats"):
        plan.calibrate(object(), repeats=0)


def test_meeting_in_collectives_is_measured_and_charged_to_multi_rank_steps_only(two):
    """``sync_jitter``: rounds of matmul segments between small AllReduces take longer than
    the AllReduces alone plus the ranks' mean compute; what they add, over that compute, is
    charged to a multi-rank step of a measured cluster, never to one rank or to GPUs."""
    from labkit.lessons.planning.checkrun import _GPT
    from labkit.plan.calibrate import Calibration
    from labkit.plan.jitter import fit_jitter, measure_jitter
    from labkit.runtime.comm.alpha_beta import AlphaBeta

    per_rank = two.run(measure_jitter, 6)
    assert all(r["segmented_s"] > r["bare_s"] + 0.5 * r["compute_s"] > 0 for r in per_rank)
    assert fit_jitter(per_rank) >= 0
    # by hand: 10 ms bare + 100 ms compute on average, 130 ms segmented: 20 ms over 100
    rows = [{"bare_s": 0.01, "segmented_s": 0.13, "compute_s": 0.09},
            {"bare_s": 0.01, "segmented_s": 0.13, "compute_s": 0.11}]
    assert fit_jitter(rows) == pytest.approx(0.2)
    assert fit_jitter([{**rows[0], "segmented_s": 0.05}]) == 0.0  # never negative
    # a rank that waited 20 ms for a core in the segmented round explains that extra: it is
    # the load's (checkrun applies it), not the meeting's
    loaded = [{**rows[0], "queued_segmented_s": 0.02}, {**rows[1], "queued_segmented_s": 0.0}]
    assert fit_jitter(loaded) == pytest.approx(0.0, abs=1e-12)
    links = {"all_reduce": AlphaBeta("all_reduce", 2, 4e-4, 1e9)}
    calm = Calibration(2, 1e11, 1e10, 2e-5, 1e9, links, cores=2)
    jumpy = dataclasses.replace(calm, sync_jitter=0.25)
    ddp = Parallelism.of(dp=2, dp_kind="ddp")
    a, b = (plan.project(_GPT, ddp, c.cluster(), global_batch=16, precision="fp32")
            for c in (calm, jumpy))
    assert b.compute_s == pytest.approx(1.25 * a.compute_s)
    assert b.comm_s == a.comm_s  # the collectives' own time is the alpha-beta fit's
    one = dataclasses.replace(jumpy, world_size=1).cluster()
    assert one.sync_jitter == 0.25 and plan.project(
        _GPT, Layout(), one, global_batch=16, precision="fp32").compute_s == pytest.approx(
        plan.project(_GPT, Layout(), dataclasses.replace(calm, world_size=1).cluster(),
                     global_batch=16, precision="fp32").compute_s)
    assert plan.GPUCluster("H100").sync_jitter == 0.0


def test_engine_probe_decoder_splits_by_tp_at_any_rank_count():
    """``calibrate`` measures tp's overhead with ``Layout(tp=ranks)`` on the probe's tiny
    decoder: its heads must divide by every rank count (3 ranks on 4 heads died deep in the
    build: "shape '[3, 3, -1]' is invalid"), with the same parameter tensors, and the fit must
    use the weight bytes of the decoder the ranks measured."""
    from labkit.plan.counts import param_tensors
    from labkit.plan.engines import WIDTHS, fit_overhead, tiny, weight_bytes
    from labkit.training.config import TrainConfig
    from labkit.training.run import resolve

    for ranks in range(1, 9):
        for width in WIDTHS:
            config = tiny(width, ranks)
            resolve(TrainConfig(model=config, layout=Layout(tp=ranks), global_batch=ranks,
                                  precision="fp32").replace(layout=Layout(tp=ranks)), ranks)
            assert param_tensors(config) == param_tensors(tiny(width))
    assert tiny(16, 2) == tiny(16)  # 1, 2 and 4 ranks measure what they did before
    sizes = {w: weight_bytes(w, 3) for w in WIDTHS}
    extra = {e: {w: 1e-3 + 1e-9 * sizes[w] for w in WIDTHS} for e in ("tp", "fsdp")}
    rank = {"tensors": param_tensors(tiny(16, 3)), "extra": extra, "weight_bytes": sizes}
    per_tensor, per_byte = fit_overhead([rank])["tp"]
    assert per_byte == pytest.approx(1e-9) and per_tensor == pytest.approx(1e-3 / rank["tensors"])


def test_search_takes_the_optimizer_and_refuses_an_unknown_one_before_any_work():
    """``search(..., optimizer=)``: every candidate is costed with it (SGD keeps no moments:
    less memory per GPU than Adam); None is Adam (SGD for a recommender); a name it does not
    know is refused before the search starts."""
    from labkit.models import GPT_7B

    node = plan.GPUCluster("H100", nodes=1)
    adam = plan.search(GPT_7B, node, global_batch=64)
    sgd = plan.search(GPT_7B, node, global_batch=64, optimizer="sgd")
    assert {p.lever.optimizer for p in adam.fits} == {"adam"}
    assert {p.lever.optimizer for p in sgd.fits} == {"sgd"}
    assert len(sgd.fits) >= len(adam.fits)
    assert min(p.peak_bytes for p in sgd.fits) < min(p.peak_bytes for p in adam.fits)
    with pytest.raises(plan.PlanError, match="optimizer is one of"):
        plan.search(GPT_7B, node, global_batch=64, optimizer="lion")


def test_calibrate_times_a_capped_cluster_and_reports_its_cap():
    """The probes time the machine, not a virtual GPU's budget: under a lesson's small cap
    they ran out of it (a DeviceOOM about batch sizes); now the cap is lifted while they run,
    put back after, and reported as the calibration's memory."""
    import labkit

    with labkit.Cluster(1, device="cpu", memory_per_device="8MiB", progress=False) as cluster:
        calibration = plan.calibrate(cluster, repeats=2)
        assert cluster.memory_per_device == 8 * 2**20
        assert calibration.memory_bytes == 8 * 2**20
        assert calibration.matmul_flops > 0 and calibration.memory_bandwidth > 0
