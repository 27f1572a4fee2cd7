"""PyTorch's DistributedDataParallel, with each bucket's AllReduce timed.

DDP registers autograd hooks; as soon as every gradient in a bucket (``bucket_cap_mb``) is
ready, it launches that bucket's AllReduce while backward goes on computing earlier layers.
The communication hook below does what DDP's default hook does (divide by world size, then
AllReduce the bucket) and records when each bucket's AllReduce starts and ends.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from labkit.comm.meter import CommMeter
from labkit.train.strategy import DataParallelBase


def _timed_allreduce_hook(meter, bucket):
    # No annotations: DDP checks them against dist.GradBucket, and this module's
    # ``from __future__ import annotations`` would turn them into strings.
    tensor = bucket.buffer()
    start = time.perf_counter()
    tensor.div_(dist.get_world_size())
    future = dist.all_reduce(tensor, async_op=True).get_future()

    def done(fut: torch.futures.Future) -> torch.Tensor:
        meter.record(tensor.nbytes, start, time.perf_counter())
        return fut.value()[0]

    return future.then(done)


class _MeasuredDDP(DistributedDataParallel):
    """DDP whose bucket (re)allocation before forward is filed as "other" memory, not as
    activations (DDP rebuilds its buckets in the second step's forward)."""

    def _pre_forward(self, *inputs, **kwargs):
        with self.labkit_tracker.label_as("other"):
            return super()._pre_forward(*inputs, **kwargs)


class DDPStrategy(DataParallelBase):
    name = "ddp"
    overlaps_comm = True

    def wrap(self, ctx, model: nn.Module, meter: CommMeter, config) -> nn.Module:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = _MeasuredDDP(model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)
        ddp.labkit_tracker = ctx.memory
        ddp.register_comm_hook(meter, _timed_allreduce_hook)
        return ddp

    def no_sync(self, model: nn.Module):
        return model.no_sync
