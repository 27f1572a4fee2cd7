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
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A rank's own part: the local shard of a tensor-parallel weight's gradient."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def average_gradients(model: nn.Module, group=None) -> None:
    """AllReduce each gradient over ``group`` and divide by its size (blocking, one call per
    tensor). A group of one rank has nothing to average."""
    size = dist.get_world_size(group)
    if size == 1:
        return
    for param in model.parameters():
        if param.grad is None:
            continue
        grad = _local(param.grad)
        dist.all_reduce(grad, group=group)  # sum over the group's ranks
        grad /= size  # mean: the gradient of the group's whole batch


def broadcast_parameters(model: nn.Module, group=None) -> None:
    """Copy the group's first rank's weights to the others (they are equal already, from the
    same seed: this makes sure)."""
    if dist.get_world_size(group) == 1:
        return
    for param in model.parameters():
        dist.broadcast(_local(param.data), group=group, group_src=0)
