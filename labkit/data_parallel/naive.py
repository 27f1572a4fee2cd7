"""Data parallelism written by hand, for teaching.

Every rank holds the same weights (same seed, and a broadcast from rank 0 to be sure), trains
on its own slice of the batch, then averages the gradients with one AllReduce per parameter:

    for p in model.parameters():
        dist.all_reduce(p.grad)      # sum over ranks
        p.grad /= world_size         # mean: the gradient of the whole batch

After that every rank takes the same optimizer step, so the weights stay identical and the
result equals one device training on the whole batch. PyTorch's DDP (``ddp.py``) does the same
arithmetic, faster: it groups gradients into buckets and overlaps their AllReduce with backward.
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn

from labkit.comm.meter import CommMeter
from labkit.train.strategy import DataParallelBase


def average_gradients(model: nn.Module, world_size: int) -> None:
    """AllReduce each gradient and divide by the number of ranks (blocking, one per tensor)."""
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad)  # sum over ranks
        param.grad /= world_size  # mean: the gradient of the whole batch


class NaiveDataParallel(DataParallelBase):
    name = "naive_dp"
    counts_collectives = True

    def wrap(self, ctx, model: nn.Module, meter: CommMeter, config) -> nn.Module:
        for param in model.parameters():  # identical starting weights on every rank
            dist.broadcast(param.data, src=0)
        return model

    def sync_gradients(self, ctx, model: nn.Module, meter: CommMeter) -> None:
        average_gradients(model, ctx.world_size)
