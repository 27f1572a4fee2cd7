"""The one allocator: every layout's weights come from the same host model.

Whatever the layout, the model was built on the meta device and split there (tensor parallel
DTensors, pipeline stages, FSDP2's shards), so nothing is allocated yet. Here each rank:

1. allocates only its own shards on its device (``to_empty``);
2. builds the whole model on the host from the seed, with the CPU generator (so one seed
   gives the same initial weights for every layout and every device, GPUs included);
3. cuts its shard of each weight on the host, the way the weight's placements say (Shard,
   and FSDP-over-TP's _StridedShard, on every mesh dimension in order: what
   ``distribute_tensor(..., src_data_rank=None)`` keeps, without moving the whole weight to
   the device first), and copies just that into its device memory.

A model whose weights do not fit one device therefore never exists whole on one. On fake
tensors (the estimator) only step 1 runs: there are shapes, no values.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from itertools import chain

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.distributed.tensor import DTensor, Shard
from torch.distributed.tensor.placement_types import _StridedShard

from labkit.models import build_model, plan_for
from labkit.models.optim import weight_dtype
from labkit.parallel.tensor.apply import hand_written_params, local_piece, whole_tensor
from labkit.runtime.memory.capacity import on_host


def host_shard(tensor: torch.Tensor, mesh, placements) -> torch.Tensor:
    """This rank's piece of the whole ``tensor`` (on the host) under ``placements`` on
    ``mesh``: each sharded mesh dimension splits the piece left by the ones before it."""
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, (Shard, _StridedShard)):
            tensor = placement._shard_tensor(tensor, mesh, mesh_dim, src_data_rank=None)
    return tensor


def _tensors(module: nn.Module):
    return chain(module.named_parameters(), module.named_buffers())


def materialize(parts: list[nn.Module], names: list[dict[str, str]], config, tp: int,
                device: torch.device) -> None:
    """Allocate and fill ``parts`` (this rank's pieces of ``config.model``; ``names`` maps
    each piece's tensor names to the whole model's)."""
    for part in parts:
        part.to_empty(device=device)  # this rank's shards only
    if any(is_fake(_local(t)) for part in parts for _, t in _tensors(part)):
        return  # tracing on fake tensors: shapes only
    plan = plan_for(config.model)
    with on_host():  # whole weights exist only on the host
        host = build_model(config.model, "cpu", config.seed, weight_dtype(config.precision))
        values = dict(_tensors(host))
    with torch.no_grad():
        for part, part_names in zip(parts, names, strict=True):
            hand_written = hand_written_params(part)  # tp_kind="naive": plain shards
            for name, tensor in _tensors(part):
                full_name = part_names.get(name, name)
                with on_host():  # cut on the host: the device receives only the piece
                    source = plan.to_tp_layout(full_name, values[full_name].detach(), tp)
                    if isinstance(tensor, DTensor):
                        source = host_shard(source, tensor.device_mesh, tensor.placements)
                    elif name in hand_written:
                        source = local_piece(*hand_written[name], source)
                    source = source.contiguous()
                local = _local(tensor)
                if local.numel():
                    local.copy_(source)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@contextmanager
def _quiet_redistribution():
    """DTensor warns that gathering an FSDP-over-TP weight takes two all-gathers: true and
    harmless for copies made once, after training."""
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def full_weights(parts: list[nn.Module], names: list[dict[str, str]], config,
                 tp: int) -> dict[str, torch.Tensor]:
    """Host copies of this rank's weights, whole (sharded ones gathered: every rank of their
    mesh must call this too), by the whole model's names, in the model's own order."""
    plan = plan_for(config.model)
    out = {}
    with _quiet_redistribution():
        for part, part_names in zip(parts, names, strict=True):
            hand_written = hand_written_params(part)
            for name, value in part.state_dict().items():
                full_name = part_names.get(name, name)
                with on_host():  # copies for the caller, not the training's memory
                    whole = value.full_tensor() if isinstance(value, DTensor) else value
                    if name in hand_written:  # an all-gather over tp
                        whole = whole_tensor(*hand_written[name], whole)
                    whole = plan.from_tp_layout(full_name, whole.detach().cpu(), tp)
                    out[full_name] = whole.clone()
    return out
