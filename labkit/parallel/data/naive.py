"""Data parallelism written by hand, for teaching.

Every rank holds the same weights (same seed, and a broadcast from the group's first rank to
be sure), trains on its own slice of the batch, then averages the gradients with one
AllReduce per parameter over its data-parallel group:

    for p in model.parameters():
        dist.all_reduce(p.grad, group=group)   # sum over the group's ranks
        p.grad /= group_size                   # mean: the gradient of the group's batch

After that every rank takes the same optimizer step, so the weights stay identical and the
result equals one device training on the whole batch. PyTorch's DDP (``ddp.py``) does the same
arithmetic, faster: it groups gradients into buckets and overlaps their AllReduce with backward.

Both functions take plain tensors; training hands them a tensor-parallel model as its local
shards (``labkit/training/build/sync.py``: ``LocalShards``).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn


def average_gradients(model: nn.Module, group=None) -> None:
    """AllReduce each gradient over ``group`` and divide by its size (blocking, one call per
    tensor). A group of one rank has nothing to average."""
    size = dist.get_world_size(group)
    if size == 1:
        return
    for param in model.parameters():
        if param.grad is None:
            continue
        dist.all_reduce(param.grad, group=group)  # sum over the group's ranks
        param.grad /= size  # mean: the gradient of the group's whole batch


def broadcast_parameters(model: nn.Module, group=None) -> None:
    """Copy the group's first rank's weights to the others (they are equal already, from the
    same seed: this makes sure)."""
    if dist.get_world_size(group) == 1:
        return
    for param in model.parameters():
        dist.broadcast(param.data, group=group, group_src=0)
