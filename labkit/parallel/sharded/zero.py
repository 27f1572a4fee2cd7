"""ZeRO stage 1 (Rajbhandari et al., 2020): DDP for the gradients, optimizer state sharded.

PyTorch's ``ZeroRedundancyOptimizer`` gives each rank of the replica group a subset of the
parameters to update: rank r keeps Adam's momentum and variance only for its subset (1/N of
the state, give or take the size of whole tensors), steps them, and then broadcasts its
updated parameters to the other ranks. So gradients are still AllReduced in full (as DDP
does) and every rank still holds all parameters and gradients; what shrinks is the optimizer
state, and the price is one broadcast of all parameters per step.
"""

from __future__ import annotations

from torch.distributed.optim import ZeroRedundancyOptimizer

from labkit.models.optim import OPTIMIZERS


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


def zero1_optimizer(params, optimizer: str, lr: float, group) -> ZeroRedundancyOptimizer:
    """``optimizer`` with its state sharded over ``group`` (foreach=False as everywhere: one
    parameter at a time, the same memory on every device)."""
    return ZeroRedundancyOptimizer(list(params), optimizer_class=OPTIMIZERS[optimizer], lr=lr,
                                   process_group=group, foreach=False)
