"""FSDP2 (PyTorch's ``fully_shard``): ZeRO stage 3, every piece of model state sharded.

Each rank keeps 1/N of every parameter (a ``DTensor`` sharded on dim 0), of its gradient and
of its optimizer state. A *unit* (one layer here) gathers its whole parameters with an
all-gather just before its forward, frees them after, gathers them again for its backward, and
reduce-scatters the gradients so that each rank receives the averaged 1/N it owns. Memory per
rank falls ~1/N for model state; the price is three collectives per unit per step (all-gather
forward, all-gather backward, reduce-scatter), ~1.5x DDP's traffic.

ZeRO stage 2 (gradients and optimizer state sharded, parameters whole) has no engine of its
own in PyTorch 2.x: FSDP2 with ``reshard_after_forward=False`` still keeps parameters sharded
between steps, so it is not stage 2 and labkit does not call it that.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

from labkit.memory.capacity import on_host
from labkit.models import DLRM, GPT, MLP, build_model
from labkit.train.step import weight_dtype
from labkit.train.strategy import DataParallelBase


def shard_units(model: nn.Module) -> list[nn.Module]:
    """The modules each made one FSDP unit (gathered and freed together); the root takes the
    rest (GPT's embeddings and head, DLRM's interaction)."""
    if isinstance(model, MLP):
        return [m for m in model.layers if isinstance(m, nn.Linear)]
    if isinstance(model, GPT):
        return list(model.blocks)
    if isinstance(model, DLRM):
        return [*model.tables, model.bottom, model.top]
    raise ValueError(f"no FSDP units defined for {type(model).__name__}")


def _local_sources(model: nn.Module, values: dict[str, torch.Tensor], rank: int,
                   world_size: int) -> dict[str, torch.Tensor]:
    """This rank's piece of every parameter, cut from the host model's whole tensors the way
    FSDP2 cuts them (``torch.chunk`` on dim 0; a rank past the last chunk holds none)."""
    sources = {}
    for name, param in model.named_parameters():
        value = values[name]
        if isinstance(param, DTensor):
            chunks = value.chunk(world_size, 0)
            value = chunks[rank] if rank < len(chunks) else value[:0]
        sources[name] = value.contiguous()
    return sources


class FSDPStrategy(DataParallelBase):
    name = "fsdp"
    sharded = True
    counts_collectives = True  # all-gathers and reduce-scatters issued inside FSDP2

    def build(self, ctx, config) -> nn.Module:
        dtype = weight_dtype(config.precision)
        model = build_model(config.model, "meta", config.seed, dtype)
        with on_host():  # the mesh's rank map is a real tensor, even when estimating
            mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        for unit in shard_units(model):
            fully_shard(unit, mesh=mesh)
        fully_shard(model, mesh=mesh)
        if getattr(ctx, "estimating", False):  # fake tensors: shapes only, no values to copy
            return model.to_empty(device=ctx.device)
        with on_host():  # whole weights exist only on the host, to cut this rank's shards
            host = build_model(config.model, "cpu", config.seed, dtype)
            values = {k: v.detach() for k, v in host.named_parameters()}
            sources = _local_sources(model, values, ctx.rank, ctx.world_size)
            del host, values
        model.to_empty(device=ctx.device)  # allocates only this rank's shards
        with torch.no_grad():
            for name, param in model.named_parameters():
                local = param.to_local() if isinstance(param, DTensor) else param
                if local.numel():
                    local.copy_(sources[name])
        return model

    def no_sync(self, model: nn.Module):
        @contextlib.contextmanager
        def accumulate():  # keep gradients unsharded and local until the last micro-batch
            model.set_requires_gradient_sync(False)
            try:
                yield
            finally:
                model.set_requires_gradient_sync(True)

        return accumulate
