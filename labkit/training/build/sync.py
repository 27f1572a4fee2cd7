"""A run's hand-written gradient synchronisation: an explicit list of named steps.

After backward (and before the optimizer step) the step runs ``Built.grad_sync`` in order.
Engines that synchronise by themselves (DDP's buckets, FSDP2's reduce-scatter) add no step;
the hand-written ones each add one:

    naive data parallelism   AverageGradients(parts, dp group, "dp")
    the DLRM's tables        TableGradients(model, mesh, layout)
    expert parallelism       ExpertGradients(parts, dp group)
    context parallelism      AverageGradients(parts, cp group, "cp")   (last: after dp's)

So ``Layout(dp=2, cp=2)`` with ``dp_kind="naive"`` reads
``(AverageGradients over dp, AverageGradients over cp)``: the mean over each group in turn.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from labkit.parallel.data.naive import average_gradients
from labkit.parallel.embedding.tables import sync_table_gradients
from labkit.parallel.expert.apply import sync_expert_gradients


def _local(tensor: torch.Tensor | None) -> torch.Tensor | None:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


@dataclass
class _LocalParameter:
    """A parameter as the hand-written data parallelism sees it: its local shard (a
    DTensor's ``to_local()`` shares its storage: what is done to it is done to the weight)."""

    data: torch.Tensor
    grad: torch.Tensor | None


class LocalShards:
    """``module`` with each parameter and gradient its local shard, for the plain-tensor
    teaching functions of ``labkit/parallel/data/naive.py`` (a tensor-parallel DTensor
    weight's shard is reduced over dp shard by shard, as every rank of a tp group holds
    another)."""

    def __init__(self, module: nn.Module):
        self.module = module

    def parameters(self):
        for param in self.module.parameters():
            yield _LocalParameter(_local(param.data), _local(param.grad))


@dataclass(frozen=True)
class AverageGradients:
    """Every gradient of ``parts`` averaged over ``group`` (the ranks of mesh dimension
    ``over``): one AllReduce per tensor, then a division by the group's size."""

    parts: tuple[nn.Module, ...]
    group: Any
    over: str

    def __call__(self) -> None:
        for part in self.parts:
            average_gradients(LocalShards(part), self.group)

    def __str__(self) -> str:
        return f"average gradients over {self.over}"


@dataclass(frozen=True)
class TableGradients:
    """The DLRM's gradients with its tables placed over fsdp: the dense part summed over
    fsdp, everything over dp, each divided by the data-parallel size
    (``labkit/parallel/embedding/tables.py``)."""

    model: nn.Module
    mesh: Any
    layout: Any

    def __call__(self) -> None:
        sync_table_gradients(self.model, self.mesh, self.layout)

    def __str__(self) -> str:
        return "table gradients over fsdp and dp"


@dataclass(frozen=True)
class ExpertGradients:
    """A mixture of experts over the dp ranks: replicated weights averaged over ``group``,
    this rank's experts divided by its size (``labkit/parallel/expert/apply.py``)."""

    parts: tuple[nn.Module, ...]
    group: Any

    def __call__(self) -> None:
        sync_expert_gradients(list(self.parts), self.group)

    def __str__(self) -> str:
        return "expert replicas over dp"


SyncStep = AverageGradients | TableGradients | ExpertGradients


def run_sync(steps: tuple[SyncStep, ...]) -> None:
    """Run ``steps`` in order."""
    for step in steps:
        step()
