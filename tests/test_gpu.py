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
