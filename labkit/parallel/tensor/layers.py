"""Tensor-parallel linear layers written from scratch, for teaching (Megatron-LM style).

A matrix multiply y = x W^T can be split two ways across N ranks:

* by columns of the output (``ColumnParallelLinear``): rank r holds rows r*out/N..(r+1)*out/N
  of W and computes that slice of y from the whole x. No communication forward.
* by rows of the input (``RowParallelLinear``): rank r holds the matching slice of W's input
  columns and computes a partial y from its slice of x; the partial results are summed.

Column then row, as in a transformer MLP, needs one AllReduce forward (after the row layer)
and one backward (before the column layer): ``comm.py``'s g and f.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from labkit.parallel.tensor.comm import copy_to_parallel_region, reduce_from_parallel_region


def _shard(tensor: torch.Tensor, dim: int, rank: int, world_size: int) -> torch.Tensor:
    if tensor.shape[dim] % world_size:
        raise ValueError(f"dimension {dim} of size {tensor.shape[dim]} does not split over "
                         f"{world_size} ranks")
    return tensor.chunk(world_size, dim=dim)[rank].clone()


class ColumnParallelLinear(nn.Module):
    """This rank's slice of the output features. Input: whole; output: this rank's slice."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int, group=None):
        super().__init__()
        self.group = group  # the tensor-parallel group (None: all ranks)
        self.weight = nn.Parameter(_shard(linear.weight.detach(), 0, rank, world_size))
        self.bias = (nn.Parameter(_shard(linear.bias.detach(), 0, rank, world_size))
                     if linear.bias is not None else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = copy_to_parallel_region(x, self.group)  # (batch, in): whole on every rank
        return F.linear(x, self.weight, self.bias)  # (batch, out / N)


class RowParallelLinear(nn.Module):
    """This rank's slice of the input features. Input: this rank's slice; output: whole."""

    def __init__(self, linear: nn.Linear, rank: int, world_size: int, group=None):
        super().__init__()
        self.group = group  # the tensor-parallel group (None: all ranks)
        self.weight = nn.Parameter(_shard(linear.weight.detach(), 1, rank, world_size))
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)  # (batch, out): this rank's share of the sum
        y = reduce_from_parallel_region(partial, self.group)
        return y + self.bias if self.bias is not None else y


def parallel_mlp(mlp: nn.Sequential, rank: int, world_size: int, group=None) -> nn.Sequential:
    """Linear, activation, Linear -> column-parallel, activation, row-parallel (rank ``rank``
    of the ``world_size`` ranks of ``group``)."""
    first, activation, second = mlp
    return nn.Sequential(ColumnParallelLinear(first, rank, world_size, group), activation,
                         RowParallelLinear(second, rank, world_size, group))
