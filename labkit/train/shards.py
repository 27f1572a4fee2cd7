"""Give a model built on the meta device only this rank's slices of its weights.

Strategies that split weights (tensor parallel, embedding tables by rows) build the model on
the meta device, let DTensor mark which parameters are sharded, and then call
``allocate_shards``: each rank cuts its slice of every weight from a model the host
assembled, and only that slice is allocated on the device, one parameter at a time (so a
model whose weights do not fit one device never exists whole on one).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from labkit.memory.capacity import on_host


def allocate_shards(model: nn.Module, values: dict[str, torch.Tensor], rank: int,
                    world_size: int, device: torch.device) -> None:
    """Replace every meta parameter of ``model`` by this rank's part of ``values`` (whole
    tensors by name, on the host): whole where it is not sharded, else the ``torch.chunk``
    DTensor's ``Shard(dim)`` gives rank ``rank``."""
    for module_name, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            with on_host():  # cut on the host: the device receives only the slice
                source = values[f"{module_name}.{name}" if module_name else name].detach()
                if isinstance(param, DTensor) and isinstance(param.placements[0], Shard):
                    source = source.chunk(world_size, param.placements[0].dim)[rank]
                source = source.contiguous()
            local = source.to(device, copy=True)
            if isinstance(param, DTensor):
                local = DTensor.from_local(local, param.device_mesh, param.placements,
                                           run_check=False, shape=param.shape,
                                           stride=param.stride())
            setattr(module, name, nn.Parameter(local))
