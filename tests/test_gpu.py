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


# ----- issue 18's runtime claims, on real GPUs (their logic is proven on CPU in
# tests/test_gpu_logic.py) -------------------------------------------------------------------

def _allocate(ctx, nbytes):
    return torch.empty(int(nbytes), dtype=torch.uint8, device=ctx.device).numel()


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
    from labkit.cluster.hardware import physical_cores

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
