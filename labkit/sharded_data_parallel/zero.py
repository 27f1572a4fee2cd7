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

from labkit.data_parallel.ddp import DDPStrategy
from labkit.train.step import OPTIMIZERS


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


class Zero1Strategy(DDPStrategy):
    """DDP's model wrapper (bucketed AllReduce overlapped with backward; the broadcasts come
    after backward) with ZeRO's optimizer."""

    name = "zero1"
    sharded = True

    def make_optimizer(self, model: nn.Module, config):
        # foreach=False as in train/step.py: one parameter at a time, same memory everywhere.
        return ZeroRedundancyOptimizer(model.parameters(),
                                       optimizer_class=OPTIMIZERS[config.optimizer],
                                       lr=config.lr, foreach=False)
