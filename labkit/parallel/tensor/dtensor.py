"""Tensor parallelism with PyTorch's engine: DTensor's ``parallelize_module``.

``ColwiseParallel`` and ``RowwiseParallel`` shard a linear layer's weight as ``layers.py``
does by hand, and insert the same collectives on the tp group (an all-reduce after the
row-wise layer's forward, and before the column-wise layer's input gradient). Each zoo
model's plan (which layer gets which style) lives beside the model, in
``labkit/models/*_split.py``.
"""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import parallelize_module

from labkit.models.mlp_split import linear_pairs_plan as mlp_plan


def tensor_parallel_mlp(mlp: nn.Sequential, mesh) -> nn.Module:
    """Shard a Sequential of linear pairs in place over the 1-D ``mesh`` (a run's
    ``mesh["tp"]``) and return it; training does the same to a zoo model with its plan
    (``labkit/training/build/build.py``, step 2)."""
    return parallelize_module(mlp, mesh, mlp_plan(mlp))
