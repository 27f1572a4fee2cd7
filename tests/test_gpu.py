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
