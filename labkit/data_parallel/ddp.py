"""PyTorch's DistributedDataParallel, with each bucket's AllReduce timed.

DDP registers autograd hooks; as soon as every gradient in a bucket (``bucket_cap_mb``) is
ready, it launches that bucket's AllReduce while backward goes on computing earlier layers.
The communication hook below does what DDP's default hook does (divide by world size, then
AllReduce the bucket), but from Python, through ``dist.all_reduce``, where the step's
``CollectiveMeter`` (``comm/intercept.py``) records when each bucket's AllReduce starts and
ends (DDP's built-in hook runs in C++, out of its sight).
"""

from __future__ import annotations

import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from labkit.comm.meter import CommMeter
from labkit.train.strategy import DataParallelBase


def _allreduce_hook(state, bucket):
    # No annotations: DDP checks them against dist.GradBucket, and this module's
    # ``from __future__ import annotations`` would turn them into strings.
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    return dist.all_reduce(tensor, async_op=True).get_future().then(
        lambda fut: fut.value()[0])


class _MeasuredDDP(DistributedDataParallel):
    """DDP whose bucket (re)allocation before forward is filed as "other" memory, not as
    activations (DDP rebuilds its buckets in the second step's forward)."""

    def _pre_forward(self, *inputs, **kwargs):
        with self.labkit_tracker.label_as("other"):
            return super()._pre_forward(*inputs, **kwargs)


class DDPStrategy(DataParallelBase):
    name = "ddp"
    overlaps_comm = True
    counts_collectives = True

    def wrap(self, ctx, model: nn.Module, meter: CommMeter, config) -> nn.Module:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = _MeasuredDDP(model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)
        ddp.labkit_tracker = ctx.memory
        ddp.register_comm_hook(None, _allreduce_hook)
        return ddp

    def no_sync(self, model: nn.Module):
        return model.no_sync
