"""The DLRM's embedding tables placed over the run's fsdp dimension, its dense part data
parallel: ``layout=Layout(fsdp=N)`` with ``tables="table_wise" | "row_wise" |
"row_wise_dtensor"`` (the presets "table_wise", "row_wise", "row_wise_dtensor"), and with
dp > 1 the hybrid used in production: tables sharded inside each group of fsdp ranks,
replicated across the dp groups.

Gradients, so that the ranks train exactly as one device on the whole batch: each rank's
loss is the mean over its own samples. The dense part's gradients are summed over the group,
then over the replicas, and divided by the number of slices (dp x fsdp). A table's gradient
arrives already summed over every sample of its group (the all-to-all or the reduce-scatter
sends each rank's gradient back to the rows' owner); it is summed over the replicas and
divided the same way: the sum of per-rank means over the slice count is the global mean.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

from labkit.parallel.embedding.placement import PlacementError, TablePlan
from labkit.parallel.embedding.row_sharded import RowShardedEmbedding
from labkit.parallel.embedding.sharded_dlrm import ShardedDLRM
from labkit.parallel.embedding.sizing import dlrm_plan


def table_plan(config, layout, tables: str, memory) -> TablePlan:
    """Where the tables go in each group of fsdp ranks; every rank computes the same plan,
    for the batch one group sees. When nothing fits the cap, the tables are split by rows
    anyway: the device, not the plan, then has the last word."""
    capacity = getattr(memory, "device_capacity", None) or memory.capacity_bytes
    group_config = dataclasses.replace(config, global_batch=config.global_batch // layout.dp)
    if tables.startswith("row_wise"):
        return dlrm_plan(group_config, layout.fsdp, capacity, row_wise=True)
    try:
        return dlrm_plan(group_config, layout.fsdp, capacity)
    except PlacementError as error:
        return dlrm_plan(group_config, layout.fsdp, capacity,
                         row_wise=f"{error}; tried anyway")


def shard_tables(dlrm, plan: TablePlan, mesh, engine: str) -> ShardedDLRM:
    """This rank's part of ``dlrm`` (on the meta device) under ``plan`` over ``mesh`` (the
    run's 1-D fsdp mesh);
    row-wise tables split by rows, by hand ("row_wise": gradients stay shards) or with
    DTensor's ``RowwiseParallel`` ("row_wise_dtensor": same numbers, but in torch 2.13 its
    weight gradient is the whole table on every rank)."""
    model = ShardedDLRM(dlrm, plan, mesh.get_group())
    if engine == "row_wise_dtensor" and plan.row_wise:
        style = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
        parallelize_module(model, mesh, {f"tables.{t}": style for t in plan.row_wise})
    else:
        for t in plan.row_wise:
            model.tables[str(t)] = RowShardedEmbedding(model.tables[str(t)], mesh)
    return model


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _sum_over(grads: list[torch.Tensor], group) -> None:
    if dist.get_world_size(group) > 1:
        for grad in grads:
            dist.all_reduce(grad, group=group)


def sync_table_gradients(model: ShardedDLRM, mesh, layout) -> None:
    """After backward: the means described above (hand-written collectives, counted by the
    step's meter under the fsdp and dp dimensions)."""
    groups = model.parameter_groups()
    dense = [_local(p.grad) for p in groups["dense"] if p.grad is not None]
    tables = [_local(p.grad) for p in groups["tables"] if p.grad is not None]
    _sum_over(dense, mesh.get_group("fsdp"))
    _sum_over(dense + tables, mesh.get_group("dp"))
    if layout.data_size > 1:
        for grad in dense + tables:
            grad.div_(layout.data_size)
