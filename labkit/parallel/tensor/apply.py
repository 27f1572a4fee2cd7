"""Training with the hand-written layers: a model's tensor-parallel plan carried out by
labkit's own Megatron layers (``layers.py``) instead of DTensor's ``parallelize_module``.

    apply_naive_tp(model, plan.tp_styles(model), mesh["tp"])   # TrainConfig(tp_kind="naive")

Every linear layer the plan marks ``ColwiseParallel`` becomes a ``ColumnParallelLinear`` and
every ``RowwiseParallel`` one a ``RowParallelLinear`` over the tp group, so the f and g of
``comm.py`` are the collectives that train. Their weights are plain tensors holding this
rank's shard: the build fills them with :func:`local_piece` of the whole weight
(``labkit/training/build/materialize.py``) and :func:`whole_tensor` joins them again.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear

# each hand-written layer's parameters and the dimension it splits them along (the layers
# cut them so from a whole nn.Linear; a row-parallel layer keeps its bias whole)
SPLIT_DIMS = {ColumnParallelLinear: {"weight": 0, "bias": 0}, RowParallelLinear: {"weight": 1}}
HAND_WRITTEN = tuple(SPLIT_DIMS)


def _layer_for(name: str, style):
    if type(style) is ColwiseParallel and style.use_local_output:
        return ColumnParallelLinear
    if type(style) is RowwiseParallel and style.use_local_output:
        return RowParallelLinear
    raise ValueError(f"{name}: the hand-written layers run ColwiseParallel() and "
                     f"RowwiseParallel() with their default layouts, not {style!r}: use "
                     "tp_kind='dtensor'")


def apply_naive_tp(model: nn.Module, styles: dict, mesh) -> None:
    """Replace, in place, each linear layer named in ``styles`` (a DTensor plan: {module
    name: ColwiseParallel() or RowwiseParallel()}) by its hand-written counterpart over the
    1-D ``mesh`` (a run's ``mesh["tp"]``)."""
    rank, world_size, group = mesh.get_local_rank(), mesh.size(), mesh.get_group()
    for name, style in styles.items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        layer = _layer_for(name, style)
        setattr(parent, child, layer(getattr(parent, child), rank, world_size, group))


def hand_written_params(module: nn.Module) -> dict[str, tuple[nn.Module, str]]:
    """{parameter name in ``module``: (its hand-written layer, its name there)}."""
    return {f"{prefix}.{name}" if prefix else name: (layer, name)
            for prefix, layer in module.named_modules() if isinstance(layer, HAND_WRITTEN)
            for name, _ in layer.named_parameters(recurse=False)}


def local_piece(layer: nn.Module, name: str, whole: torch.Tensor) -> torch.Tensor:
    """This rank's piece of the whole weight ``whole`` of ``layer``'s parameter ``name``."""
    dim = SPLIT_DIMS[type(layer)].get(name)
    if dim is None:
        return whole
    size, rank = dist.get_world_size(layer.group), dist.get_rank(layer.group)
    return whole.chunk(size, dim=dim)[rank]


def whole_tensor(layer: nn.Module, name: str, local: torch.Tensor) -> torch.Tensor:
    """The whole weight from every tp rank's ``local`` piece (all ranks of the tp group
    call it: an all-gather)."""
    dim = SPLIT_DIMS[type(layer)].get(name)
    if dim is None:
        return local
    pieces = [torch.empty_like(local) for _ in range(dist.get_world_size(layer.group))]
    dist.all_gather(pieces, local.contiguous(), group=layer.group)
    return torch.cat(pieces, dim=dim)
