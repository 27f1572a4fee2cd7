"""FSDP2 (PyTorch's ``fully_shard``): ZeRO stage 3, every piece of model state sharded; and
its ``replicate``, DDP rebuilt on the same machinery.

Each rank keeps 1/N of every parameter (a ``DTensor`` sharded on dim 0), of its gradient and
of its optimizer state. A *unit* (a layer, a block, a table: the model's plan says which)
gathers its whole parameters with an all-gather just before its forward, frees them after,
gathers them again for its backward, and reduce-scatters the gradients so that each rank
receives the averaged 1/N it owns. Memory per rank falls ~1/N for model state; the price is
three collectives per unit per step (all-gather forward, all-gather backward, reduce-scatter),
~1.5x DDP's traffic. On a 2-D (dp, fsdp) mesh it is HSDP: sharded over fsdp, replicated over
dp, the reduce-scattered gradients then AllReduced across replicas.

Both are applied on the meta device, before any weight exists: only this rank's shards are
ever allocated (``labkit/training/build/materialize.py``). Both compose with tensor parallelism (the
weights are then DTensors on the tp dimension too) and with torch's pipeline stages.

ZeRO stage 2 (gradients and optimizer state sharded, parameters whole) has no engine of its
own in PyTorch 2.x: FSDP2 with ``reshard_after_forward=False`` still keeps parameters sharded
between steps, so it is not stage 2 and labkit does not call it that.
"""

from __future__ import annotations

import contextlib
import warnings

import torch
from torch import nn
from torch.distributed._composable.replicate_with_fsdp import replicate
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard


def shard_dims(layout) -> tuple[str, ...]:
    """FSDP's mesh dimensions for a layout (its ``dp`` and ``fsdp`` degrees): fsdp, or
    (dp, fsdp) for HSDP."""
    return ("dp", "fsdp") if layout.dp > 1 and layout.fsdp > 1 else ("fsdp",)


def mixed_policy(precision: str, outermost: bool = False) -> MixedPrecisionPolicy:
    """FSDP2's casts for ``precision``: with "mixed" the fp32 shards (the master weights,
    their gradients and optimizer state) are gathered as bfloat16 for compute and gradients
    reduced in fp32; the outermost module returns fp32 (so the loss is fp32). Inner units
    return bfloat16: the layers of the part around them compute in bfloat16 too. Else none.
    """
    if precision != "mixed":
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                output_dtype=torch.float32 if outermost else None)


def quiet_view_warning() -> None:
    """Silence FSDP2's ``UserWarning`` that a wrapped module returned a view (torch 2.13 warns
    at every forward where the output is one, e.g. a tensor-parallel layer's local output):
    it warns that an in-place op on that view would skip a gradient hook, and labkit's step
    only reads a part's output (the loss, the next stage's input). Only that message, in the
    rank that applies FSDP2."""
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor",
                            category=UserWarning)


def apply_fsdp(part: nn.Module, units: list[nn.Module], mesh,
               precision: str = "fp32") -> nn.Module:
    """``fully_shard`` each unit, then the part itself (it takes what the units left)."""
    quiet_view_warning()
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=mixed_policy(precision))
    return fully_shard(part, mesh=mesh, mp_policy=mixed_policy(precision, outermost=True))


def apply_replicate(part: nn.Module, mesh) -> nn.Module:
    """PyTorch's ``replicate``: each rank keeps the whole part, gradients AllReduced over
    ``mesh`` (the dp dimension). DDP's successor on FSDP2's machinery: unlike
    ``DistributedDataParallel`` it takes tensor-parallel DTensor weights, and
    torch.distributed.pipelining drives it (DDP's buckets break under GPipe's order in torch
    2.13). In torch 2.13 it also computes on a copy of the part's weights (its all-gather
    buffer, filled even with nothing to gather), alive through forward and backward."""
    quiet_view_warning()
    return replicate(part, mesh=mesh)


def fsdp_no_sync(parts: list[nn.Module]):
    """A context that keeps gradients local (accumulating micro-batches) until the last."""

    @contextlib.contextmanager
    def accumulate():
        modules = [p for p in parts if isinstance(p, FSDPModule)]
        for module in modules:
            module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            for module in modules:
                module.set_requires_gradient_sync(True)

    return accumulate
