"""Expert parallelism applied to the MoE GPT, over the data-parallel ranks.

Choice (DeepSpeed-MoE's and torchtitan's, where experts borrow the data-parallel ranks):
``Layout(dp=N, ep=N)`` keeps the N data-parallel replicas of everything but the experts;
each MoE layer's experts are cut into N groups, one per rank, as DTensors ``Shard(0)`` over
``mesh["dp"]`` (so the one allocator fills each rank's experts from the host model, and
``full_weights`` gathers them). Gradients: the replicated weights are averaged over dp as
in data parallelism (hand-written AllReduce); an expert's gradient already holds the
contributions of every rank's tokens (they came to it by all-to-all), each from a loss that
was a mean over that rank's slice, so it is divided by N, not averaged.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Shard

from labkit.parallel.expert.dispatch import ExpertExchange


def shard_experts(model: nn.Module, mesh, group) -> None:
    """On the meta device: each MoE layer's experts cut over ``mesh`` (1-D, the dp ranks),
    and its experts run through the all-to-all exchange over ``group``."""
    from labkit.models.moe import MoE

    for layer in (m for m in model.modules() if isinstance(m, MoE)):
        experts = layer.experts
        for name, param in list(experts.named_parameters(recurse=False)):
            local = torch.empty((param.shape[0] // mesh.size(), *param.shape[1:]),
                                dtype=param.dtype, device=param.device)
            sharded = DTensor.from_local(local, mesh, [Shard(0)], run_check=False)
            setattr(experts, name, nn.Parameter(sharded))
        layer.exchange = ExpertExchange(group)


def sync_expert_gradients(parts: list[nn.Module], group) -> None:
    """After backward: replicated gradients averaged over ``group``, experts' divided by
    its size (one AllReduce per replicated tensor; none for the experts)."""
    size = dist.get_world_size(group)
    for part in parts:
        for param in part.parameters():
            if param.grad is None:
                continue
            if isinstance(param, DTensor):  # this rank's experts: every rank's tokens
                param.grad.to_local().div_(size)
                continue
            dist.all_reduce(param.grad, group=group)
            param.grad /= size
