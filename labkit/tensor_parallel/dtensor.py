"""Tensor parallelism with PyTorch's engine: DTensor's ``parallelize_module``.

``ColwiseParallel`` and ``RowwiseParallel`` shard a linear layer's weight as ``layers.py``
does by hand, and insert the same collectives (an all-reduce after the row-wise layer's
forward, and before the column-wise layer's input gradient).
"""

from __future__ import annotations

from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)


def mlp_plan(mlp: nn.Sequential) -> dict:
    """Pairs of linear layers in a Sequential: column-wise, then row-wise. With an odd count
    the last layer stays whole on every rank (replicated)."""
    linears = [name for name, module in mlp.named_children() if isinstance(module, nn.Linear)]
    plan = {}
    for column, row in zip(linears[::2], linears[1::2], strict=False):  # odd: last left out
        plan[column], plan[row] = ColwiseParallel(), RowwiseParallel()
    return plan


def tensor_parallel_mlp(mlp: nn.Sequential, device_type: str, world_size: int) -> nn.Module:
    """Shard ``mlp`` in place over all ranks (a 1-D device mesh) and return it."""
    mesh = init_device_mesh(device_type, (world_size,))
    return parallelize_module(mlp, mesh, mlp_plan(mlp))
