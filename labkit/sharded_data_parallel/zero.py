"""ZeRO stage 1 (Rajbhandari et al., 2020): DDP for the gradients, optimizer state sharded.

PyTorch's ``ZeroRedundancyOptimizer`` gives each rank a subset of the parameters to update:
rank r keeps Adam's momentum and variance only for its subset (1/N of the state, give or take
the size of whole tensors), steps them, and then broadcasts its updated parameters to the
other ranks. So gradients are still AllReduced in full (as DDP does) and every rank still
holds all parameters and gradients; what shrinks is the optimizer state, and the price is one
broadcast of all parameters per step.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from labkit.comm.meter import CommMeter
from labkit.data_parallel.ddp import _MeasuredDDP
from labkit.train.step import OPTIMIZERS
from labkit.train.strategy import DataParallelBase


def zero1_partition(sizes: list[int], world_size: int) -> list[list[int]]:
    """Which parameters (by index) each rank updates: ``ZeroRedundancyOptimizer``'s rule,
    largest tensor first onto the rank holding the fewest elements so far."""
    totals = [0] * world_size
    owned = [[] for _ in range(world_size)]
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        rank = totals.index(min(totals))
        owned[rank].append(index)
        totals[rank] += sizes[index]
    return owned


class Zero1Strategy(DataParallelBase):
    name = "zero1"
    overlaps_comm = True  # DDP's bucketed AllReduce; the broadcasts come after backward
    sharded = True
    counts_collectives = True

    def wrap(self, ctx, model: nn.Module, meter: CommMeter, config) -> nn.Module:
        device_ids = [ctx.device.index] if ctx.device.type == "cuda" else None
        ddp = _MeasuredDDP(model, device_ids=device_ids, bucket_cap_mb=config.bucket_cap_mb)
        ddp.labkit_tracker = ctx.memory
        return ddp

    def make_optimizer(self, model: nn.Module, config):
        # foreach=False as in train/step.py: one parameter at a time, same memory everywhere.
        return ZeroRedundancyOptimizer(model.parameters(),
                                       optimizer_class=OPTIMIZERS[config.optimizer],
                                       lr=config.lr, foreach=False)

    def no_sync(self, model: nn.Module):
        return model.no_sync
