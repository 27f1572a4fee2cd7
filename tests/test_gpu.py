"""The GPU path: NCCL ranks on real GPUs. Skipped on machines without enough CUDA devices."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import labkit

needs_two_gpus = pytest.mark.skipif(torch.cuda.device_count() < 2,
                                    reason="needs 2 CUDA GPUs (CPU CI has none)")


@pytest.mark.gpu
@needs_two_gpus
def test_auto_picks_one_gpu_per_rank_with_nccl():
    def where(ctx):
        value = torch.tensor([float(ctx.rank)], device=ctx.device)
        dist.all_reduce(value)
        return str(ctx.device), torch.cuda.current_device(), value.item()

    with labkit.Cluster(2, progress=False) as cluster:
        assert cluster.backend == "nccl"
        assert cluster.run(where) == [("cuda:0", 0, 1.0), ("cuda:1", 1, 1.0)]


@pytest.mark.gpu
@needs_two_gpus
def test_nccl_failure_is_reported_and_recovers():
    def crash(ctx):
        if ctx.rank == 1:
            raise RuntimeError("boom")
        dist.all_reduce(torch.ones(1, device=ctx.device))

    with labkit.Cluster(2, device="cuda", progress=False) as cluster:
        with pytest.raises(labkit.RankError, match="boom"):
            cluster.run(crash)
        assert cluster.run(lambda ctx: ctx.rank) == [0, 1]


needs_a_gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.gpu
@needs_a_gpu
def test_cuda_oom_under_a_capacity_is_device_oom():
    def allocate(ctx, nbytes):
        return torch.empty(nbytes, dtype=torch.uint8, device=ctx.device).numel()

    with labkit.Cluster(1, device="cuda", memory_per_device="256MiB", progress=False) as c:
        assert c.run(allocate, 64 * 2**20) == [64 * 2**20]
        with pytest.raises(labkit.DeviceOOM) as info:
            c.run(allocate, 512 * 2**20)
        assert info.value.capacity_bytes == 256 * 2**20 and "CUDA said" in str(info.value)
        assert c.run(allocate, 64 * 2**20) == [64 * 2**20]


@pytest.mark.gpu
@needs_a_gpu
def test_more_ranks_than_gpus_share_them_when_capped():
    ranks = torch.cuda.device_count() + 1
    with labkit.Cluster(ranks, device="cuda", memory_per_device="1GiB", progress=False) as c:
        assert c.shared_gpus and c.backend == "gloo"

        def total(ctx):
            value = torch.ones(1, device=ctx.device)
            dist.all_reduce(value)
            return value.item()

        results = c.run(total)
        assert results == [float(ranks)] * ranks and results.shared_gpus


@pytest.mark.gpu
@needs_two_gpus
def test_sharded_strategies_on_nccl_equal_ddp():
    with labkit.Cluster(2, device="cuda", progress=False) as cluster:
        runs = {s: labkit.train(cluster, model="mlp", strategy=s, global_batch=32, steps=3)
                for s in ("ddp", "zero1", "fsdp")}
    for strategy in ("zero1", "fsdp"):
        assert runs[strategy].losses == pytest.approx(runs["ddp"].losses, abs=1e-5)
        assert runs[strategy].ranks[0]["records"][-1]["comm_bytes"] > 0
    assert max(runs["fsdp"].peak_bytes) < max(runs["ddp"].peak_bytes)


@pytest.mark.gpu
@needs_two_gpus
def test_one_seed_gives_the_same_weights_to_every_layout_on_cuda():
    """Issue 18: weights come from the host's CPU generator for every layout, GPUs too."""
    config = labkit.TrainConfig(model="mlp", global_batch=16, steps=1, lr=0.0,
                                optimizer="sgd", micro_batches=2, return_weights=True)
    want = labkit.models.build_model(config.model, "cpu").state_dict()
    with labkit.Cluster(2, device="cuda", progress=False) as cluster:
        for strategy in ("ddp", "fsdp", "tp", "gpipe", "naive_pipeline"):
            report = labkit.train(cluster, config, strategy=strategy, estimate=False)
            for rank in report.ranks:
                for name, value in rank["weights"].items():
                    assert torch.equal(value, want[name]), (strategy, name)


@pytest.mark.gpu
@needs_two_gpus
def test_pipelines_tensor_parallel_and_tables_train_on_nccl():
    with labkit.Cluster(1, device="cuda", progress=False) as one:
        reference = labkit.train(one, model="mlp", global_batch=16, steps=3, estimate=False)
        tables = labkit.train(one, model="dlrm", global_batch=16, steps=3, estimate=False)
    with labkit.Cluster(2, device="cuda", progress=False) as cluster:
        for strategy, micro in (("gpipe", 2), ("1f1b", 2), ("naive_pipeline", 1), ("tp", 1)):
            report = labkit.train(cluster, model="mlp", strategy=strategy, global_batch=16,
                                  steps=3, micro_batches=micro)
            assert report.losses == pytest.approx(reference.losses, rel=1e-4), strategy
        report = labkit.train(cluster, model="dlrm", strategy="table_wise", global_batch=16,
                              steps=3)
        assert report.losses == pytest.approx(tables.losses, rel=1e-4)


# ----- issue 18's runtime claims, on real GPUs (their logic is proven on CPU in
# tests/test_gpu_logic.py) -------------------------------------------------------------------

def _allocate(ctx, nbytes):
    return torch.empty(int(nbytes), dtype=torch.uint8, device=ctx.device).numel()


@pytest.mark.gpu
@needs_a_gpu
def test_a_collective_is_timed_on_the_gpu_not_at_its_launch():
    """Issue 18: NCCL's future completes at launch, so host times mark launches. With the
    device clock a collective queued behind 10 large matmuls starts, on the record, when the
    GPU reaches it, after the matmuls are done."""
    def meter(ctx):
        from labkit.runtime.comm.clock import clock_for
        from labkit.runtime.comm.intercept import CollectiveMeter
        from labkit.runtime.comm.meter import CommMeter

        x, t = torch.randn(8192, 8192, device=ctx.device), torch.ones(2**26, device=ctx.device)
        dist.all_reduce(t)
        torch.cuda.synchronize()
        m = CommMeter(clock_for(ctx.device))
        m.clock.start()
        before = m.clock.mark()
        for _ in range(10):
            x @ x  # GPU work queued ahead of the collective
        matmuls = m.clock.mark()
        with CollectiveMeter(m):  # settles: synchronizes and resolves the marks
            dist.all_reduce(t)
        (start, end), done = m.intervals[0], m.clock.seconds(matmuls)
        return start - done, end - start, done - m.clock.seconds(before)

    with labkit.Cluster(1, device="cuda", progress=False) as cluster:
        after_matmuls, duration, matmul_s = cluster.run(meter, timeout=120)[0]
    assert matmul_s > 0.005  # the matmuls took real GPU time
    assert after_matmuls > -1e-4 and duration > 0


@pytest.mark.gpu
@needs_a_gpu
def test_cuda_oom_keeps_cudas_words_and_size():
    with labkit.Cluster(1, device="cuda", memory_per_device="256MiB", progress=False) as c:
        with pytest.raises(labkit.DeviceOOM) as info:
            c.run(_allocate, 512 * 2**20)
    oom = info.value
    assert oom.requested_bytes == 512 * 2**20 and "CUDA said" in oom.detail
    assert oom.rank == 0 and oom.device == "cuda:0"


@pytest.mark.gpu
@needs_a_gpu
def test_lowering_a_cap_is_enforced_despite_cached_blocks():
    with labkit.Cluster(1, device="cuda", progress=False) as c:
        c.run(_allocate, 4 * 2**30)  # freed on return, kept in PyTorch's cache
        c.memory_per_device = "1GiB"
        with pytest.raises(labkit.DeviceOOM):
            c.run(_allocate, 2 * 2**30)


@pytest.mark.gpu
@needs_a_gpu
def test_ranks_sharing_a_gpu_without_a_cap_get_an_even_share():
    ranks = torch.cuda.device_count() + 1
    with labkit.Cluster(ranks, device="cuda", progress=False) as c:
        shares = c.run(lambda ctx: torch.cuda.get_per_process_memory_fraction(ctx.device))
        info = c.ranks
    sharing = [r["ranks_on_gpu"] for r in info]
    assert all(abs(f - 1 / n) < 1e-6 for f, n in zip(shares, sharing, strict=True))


@pytest.mark.gpu
@needs_a_gpu
def test_caps_that_overfill_a_shared_gpu_are_refused_before_any_rank_starts():
    from tests.conftest import descendants

    total = torch.cuda.get_device_properties(0).total_memory
    before = descendants()
    with pytest.raises(ValueError, match="share one GPU"):
        labkit.Cluster(3 * torch.cuda.device_count(), device="cuda",
                       memory_per_device=int(0.6 * total))
    assert descendants() == before


@pytest.mark.gpu
@needs_a_gpu
def test_cuda_results_come_back_as_host_copies():
    with labkit.Cluster(1, device="cuda", progress=False) as c:
        result = c.run(lambda ctx: {"t": torch.ones(3, device=ctx.device),
                                    "p": torch.nn.Parameter(torch.ones(2, device=ctx.device))})
    assert result[0]["t"].device.type == "cpu" and result[0]["p"].device.type == "cpu"


@pytest.mark.gpu
@needs_a_gpu
def test_gpu_ranks_share_the_hosts_cores():
    from labkit.runtime.cluster.hardware import physical_cores

    gpus = torch.cuda.device_count()
    with labkit.Cluster(gpus, device="cuda", progress=False) as c:
        assert c.run(lambda ctx: torch.get_num_threads()) == [max(1, physical_cores() // gpus)
                                                              ] * gpus


@pytest.mark.gpu
@needs_a_gpu
def test_gpu_memory_is_freed_when_a_rank_is_killed():
    import os
    import signal

    def free_bytes(ctx):
        return torch.cuda.mem_get_info(ctx.device)[0]

    def hold_and_die(ctx):
        ctx.state["held"] = torch.empty(2 * 2**30, dtype=torch.uint8, device=ctx.device)
        torch.cuda.synchronize(ctx.device)
        os.kill(os.getpid(), signal.SIGKILL)

    with labkit.Cluster(1, device="cuda", progress=False) as c:
        before = c.run(free_bytes)[0]
        with pytest.raises(labkit.RankError, match="SIGKILL"):
            c.run(hold_and_die)
        assert c.run(free_bytes)[0] > before - 256 * 2**20


@pytest.mark.gpu
@needs_two_gpus
def test_mismatched_collectives_fail_in_their_own_run():
    """NCCL returns before the work is done: without the end-of-run synchronise this run
    would 'succeed' and the next would hang until the watchdog."""
    def only_rank_0_reduces(ctx):
        if ctx.rank == 0:
            dist.all_reduce(torch.ones(1, device=ctx.device))

    with labkit.Cluster(2, device="cuda", progress=False) as c:
        with pytest.raises((labkit.RunTimeout, labkit.RankError)):
            c.run(only_rank_0_reduces, timeout=30)
        assert c.run(lambda ctx: ctx.rank, timeout=60) == [0, 1]


@pytest.mark.gpu
@needs_two_gpus
def test_the_watchdogs_reason_and_ncclS_output_reach_the_notebook(monkeypatch, capfd):
    monkeypatch.setenv("NCCL_DEBUG", "WARN")

    def rank_1_never_joins(ctx):
        if ctx.rank == 0:
            dist.all_reduce(torch.ones(1, device=ctx.device))
            torch.cuda.synchronize(ctx.device)

    with labkit.Cluster(2, device="cuda", progress=False, collective_timeout=10) as c:
        with pytest.raises(labkit.RankError) as info:
            c.run(rank_1_never_joins, timeout=120)
    assert info.value.rank == 0
    out = capfd.readouterr()
    assert "[rank 0]" in out.err + out.out  # C++ output (the watchdog) went through the pipes
