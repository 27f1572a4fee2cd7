"""The two collectives of tensor parallelism, as named autograd operations.

From Shoeybi et al., "Megatron-LM: Training Multi-Billion Parameter Language Models Using
Model Parallelism" (2019), section 3, where they are called f and g:

* ``copy_to_parallel_region`` (f): identity forward, AllReduce backward. Put before a
  column-parallel layer: every rank needs the whole input, and each rank's gradient of that
  input covers only its columns, so the gradients are summed.
* ``reduce_from_parallel_region`` (g): AllReduce forward, identity backward. Put after a
  row-parallel layer: each rank computed a partial sum of the output, so the partial sums are
  added; the gradient of a sum reaches every term unchanged.

Written by hand for teaching; ``dtensor.py`` gets the same from PyTorch's DTensor.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class _CopyToParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _ReduceFromParallelRegion(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return grad, None


def copy_to_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """f: copy forward, all-reduce backward, over the tensor-parallel ``group`` (None: all
    ranks)."""
    return _CopyToParallelRegion.apply(x, group)


def reduce_from_parallel_region(x: torch.Tensor, group=None) -> torch.Tensor:
    """g: all-reduce forward, copy (identity) backward, over the tensor-parallel ``group``."""
    return _ReduceFromParallelRegion.apply(x, group)
