"""Embedding tables sharded over ranks, the dense part data parallel: "table_wise", "row_wise".

    labkit.train(cluster, model=DLRMConfig(...), strategy="table_wise", global_batch=512)

Each rank builds the model on the meta device (no memory), keeps only its tables (or its rows
of every table), and allocates and fills just those, cut from a model the host assembled: so
tables that do not fit one device never exist whole on one.

Gradients, so that N ranks train exactly as one device on the whole batch: each rank's loss
is the mean over its own samples. The dense part's gradients are averaged over ranks, as in
data parallelism. A table's gradient arrives already summed over every rank's samples (the
all-to-all or the reduce-scatter sends each rank's gradient back to the rows' owner), so it is
divided by N: the sum of N per-rank means, over N, is the global batch's mean.

Measured on top of the shared loop: every collective (``counts_collectives``), the time spent
in lookups (forward and weight-gradient, collectives inside excluded), the bytes each rank
holds for tables and for the dense part, and the held-out AUC after every step.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import RowwiseParallel, parallelize_module

from labkit.comm.meter import union_seconds
from labkit.data_parallel.naive import average_gradients
from labkit.embedding_parallel.evaluate import evaluate_on_ranks
from labkit.embedding_parallel.planner import PlanError, TablePlan
from labkit.embedding_parallel.row_sharded import RowShardedEmbedding, row_range
from labkit.embedding_parallel.sharded_dlrm import ShardedDLRM
from labkit.embedding_parallel.sizing import dlrm_plan
from labkit.memory.capacity import on_host
from labkit.models import build_model
from labkit.train.shards import allocate_shards
from labkit.train.step import weight_dtype
from labkit.train.strategy import DataParallelBase


def _local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def time_outside(windows, excluded) -> float:
    """Seconds covered by ``windows`` but not by ``excluded`` (both lists of (start, end)):
    |W minus E| = |W or E| - |E|."""
    return union_seconds([*windows, *excluded]) - union_seconds(excluded)


class TableWiseStrategy(DataParallelBase):
    """Whole tables placed on ranks by the planner (row-wise for a table that fits none).

    ``engine`` splits row-wise tables: "shards" (``row_sharded.py``, gradients stay shards)
    or "dtensor" (DTensor's ``RowwiseParallel``; same numbers, whole-table gradients).
    """

    name = "table_wise"
    counts_collectives = True  # the ids' all-gather, the exchanges, the dense AllReduces
    estimable = False  # estimate_memory does not trace these yet: the plan estimates instead

    def __init__(self, engine: str = "shards"):
        if engine not in ("shards", "dtensor"):
            raise ValueError(f"unknown row-wise engine {engine!r}: 'shards' or 'dtensor'")
        self.engine = engine
        if engine == "dtensor":
            self.name = f"{self.name}_dtensor"

    def check_model(self, model_config, world_size: int = 1) -> None:
        if model_config.name != "dlrm":
            raise ValueError(f"'{self.name}' shards the embedding tables of the zoo's 'dlrm', "
                             f"not {model_config.name!r}")

    def plan(self, ctx, config) -> TablePlan:
        """The placement; every rank computes the same one. When nothing fits the cap, the
        tables are split by rows anyway: the device, not the plan, then has the last word."""
        capacity = getattr(ctx.memory, "device_capacity", None) or ctx.memory.capacity_bytes
        try:
            return dlrm_plan(config, ctx.world_size, capacity)
        except PlanError as error:
            return dlrm_plan(config, ctx.world_size, capacity, row_wise=f"{error}; tried anyway")

    def build(self, ctx, config) -> nn.Module:
        dtype = weight_dtype(config.precision)
        self.table_plan = self.plan(ctx, config)
        model = ShardedDLRM(build_model(config.model, "meta", config.seed, dtype),
                            self.table_plan, ctx.rank)
        if self.table_plan.row_wise:
            self._shard_rows(model, ctx)
        with on_host():  # whole weights exist only on the host, to cut this rank's part
            host = build_model(config.model, "cpu", config.seed, dtype)
            values = {k: v.detach() for k, v in host.named_parameters()}
            del host
        allocate_shards(model, values, ctx.rank, ctx.world_size, ctx.device)
        return model

    def _shard_rows(self, model: ShardedDLRM, ctx) -> None:
        """Split the plan's row-wise tables (still on the meta device) over all ranks."""
        with on_host():  # the mesh's rank map is a real tensor
            mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        if self.engine == "dtensor":  # PyTorch's: the gradient comes out whole (row_sharded.py)
            style = RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(0))
            parallelize_module(model, mesh, {f"tables.{t}": style
                                             for t in self.table_plan.row_wise})
            return
        for t in self.table_plan.row_wise:
            model.tables[str(t)] = RowShardedEmbedding(model.tables[str(t)], mesh, ctx.rank)

    def wrap(self, ctx, model: nn.Module, meter, config) -> nn.Module:
        self._meter, self._config, self._step = meter, config, 0
        self._auc_before = evaluate_on_ranks(ctx, model, config)
        model.lookup_windows.clear()
        return model

    def make_optimizer(self, model: nn.Module, config):
        self._optimizer = super().make_optimizer(model, config)
        return self._optimizer

    def sync_gradients(self, ctx, model: nn.Module, meter) -> None:
        groups = model.parameter_groups()
        self._gradient_bytes = {part: sum(_local(p.grad).nbytes for p in params
                                          if p.grad is not None)
                                for part, params in groups.items()}
        if ctx.world_size == 1:
            return
        average_gradients(model.dense_modules(), ctx.world_size)  # counted by the loop
        for param in groups["tables"]:
            if param.grad is not None:
                param.grad.div_(ctx.world_size)  # summed over every rank's samples

    def _state_bytes(self, model: nn.Module) -> dict[str, dict[str, int]]:
        """Bytes this rank holds, by part (tables, dense) and kind."""
        out = {}
        for part, params in model.parameter_groups().items():
            optimizer = sum(_local(v).nbytes for p in params
                            for v in self._optimizer.state.get(p, {}).values()
                            if isinstance(v, torch.Tensor))
            out[part] = {"parameters": sum(_local(p).nbytes for p in params),
                         "gradients": self._gradient_bytes[part], "optimizer": optimizer}
        return out

    def step_extras(self, ctx, model: nn.Module) -> dict:
        lookup_s = time_outside(model.lookup_windows, self._meter.intervals)
        model.lookup_windows.clear()
        extras = {"lookup_s": lookup_s, "state_bytes": self._state_bytes(model),
                  "held_out_auc": evaluate_on_ranks(ctx, model, self._config)}
        model.lookup_windows.clear()
        if self._step == 0:  # once per run: what the rank was given, and where it started
            extras.update(plan=self.table_plan.to_dict(), auc_before=self._auc_before)
        self._step += 1
        return extras


class RowWiseStrategy(TableWiseStrategy):
    """Every table's rows split over all ranks."""

    name = "row_wise"

    def check_model(self, model_config, world_size: int = 1) -> None:
        super().check_model(model_config, world_size)
        rows = model_config.rows_per_table
        if row_range(rows, world_size - 1, world_size)[1] == 0:
            raise ValueError(f"{rows} rows per table leave the last of {world_size} ranks "
                             "without any: choose rows_per_table a multiple of the rank count")

    def plan(self, ctx, config) -> TablePlan:
        capacity = getattr(ctx.memory, "device_capacity", None) or ctx.memory.capacity_bytes
        return dlrm_plan(config, ctx.world_size, capacity, row_wise=True)
