"""PyTorch's DistributedDataParallel on a replica group, with each bucket's AllReduce timed.

DDP registers autograd hooks; as soon as every gradient in a bucket (``bucket_cap_mb``) is
ready, it launches that bucket's AllReduce while backward goes on computing earlier layers.
The communication hook below does what DDP's default hook does (divide by the group's size,
then AllReduce the bucket), but from Python, through ``dist.all_reduce`` on the named group,
where the step's ``CollectiveMeter`` (``runtime/comm/intercept.py``) records when each bucket's
AllReduce starts and ends (DDP's built-in hook runs in C++, out of its sight).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def _allreduce_hook(group, bucket):
    # No annotations: DDP checks them against dist.GradBucket, and a module-level
    # ``from __future__ import annotations`` would turn them into strings.
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size(group))
    return dist.all_reduce(tensor, group=group, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


def _file_bucket_memory_as_other(ddp: DistributedDataParallel, tracker) -> None:
    """DDP (re)allocates its buckets before the wrapped module runs (it rebuilds them in the
    second step's forward); a memory tracker would call them activations. Between DDP's
    forward pre-hook and the wrapped module's, allocations are filed as "other"."""
    stack = contextlib.ExitStack()

    def enter(module, args) -> None:
        stack.enter_context(tracker.label_as("other"))

    def leave(module, args) -> None:
        stack.close()

    ddp.register_forward_pre_hook(enter)
    ddp.module.register_forward_pre_hook(leave, prepend=True)


def wrap_ddp(module: nn.Module, group, device: torch.device, bucket_cap_mb: float,
             tracker) -> DistributedDataParallel:
    """``module`` (already on its device) as a DDP replica over ``group``."""
    device_ids = [device.index] if device.type == "cuda" else None
    ddp = DistributedDataParallel(module, device_ids=device_ids, process_group=group,
                                  bucket_cap_mb=bucket_cap_mb)
    ddp.register_comm_hook(group, _allreduce_hook)
    _file_bucket_memory_as_other(ddp, tracker)
    return ddp


def bucket_bytes(module: nn.Module) -> int:
    """DDP keeps one flat buffer per bucket: as many bytes as the parameters."""
    return sum(p.numel() * p.element_size() for p in module.parameters())
