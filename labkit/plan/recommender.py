"""A recommender's (DLRM's) step on a named cluster: memory by category with its tables
placed whole, by rows or replicated, and the collectives of table placement (no trace: the
tables are the size)."""

from __future__ import annotations

import math

from labkit.plan.counts import sample_counts
from labkit.plan.parallelism import Parallelism
from labkit.plan.step import Lever, _zero_stage
from labkit.runtime.costs import OPTIMIZER_STATE_COPIES, model_state_bytes


def recommender_memory(model_config, layout: Parallelism, lever: Lever) -> dict[str, float]:
    """Peak bytes by category on the worst rank of a DLRM layout (no trace).

    Tables: whole tables spread over the fsdp group (table_wise: the fullest rank holds
    ceil(tables / fsdp) of them; labkit's planner balances equal tables so), rows split
    (row_wise), or every table on every rank (replicas). FSDP without ``tables`` shards all
    state. The dense MLPs are replicated; activations are the batch's looked-up rows and the
    MLPs' outputs, small beside the tables."""
    counts = sample_counts(model_config)
    table = model_config.rows_per_table * model_config.embedding_dim
    tables = model_config.num_tables * table
    dense = counts.params - tables
    if layout.tables == "table_wise":
        here = math.ceil(model_config.num_tables / layout.fsdp) * table
    elif layout.tables is not None:
        here = tables / layout.fsdp
    else:
        here = tables
    stage, shards = _zero_stage(layout) if layout.tables is None else (0, 1)
    state = model_state_bytes(here + dense, shards, stage, "fp32" if lever.precision ==
                              "mixed" else lever.precision)
    optimizer = state["optimizer"] * OPTIMIZER_STATE_COPIES[lever.optimizer] / 2
    micro = lever.global_batch / layout.data_size / lever.micro_batches
    width = model_config.embedding_dim * (model_config.num_tables + 1)
    activations = micro * (width + model_config.bottom_hidden + model_config.top_hidden) * 4 * 4
    return {"parameters": state["parameters"], "gradients": state["gradients"],
            "optimizer": optimizer, "activations": activations, "other": 0.0}


def table_comm(model_config, layout: Parallelism, lever: Lever) -> dict:
    """A DLRM whose tables are placed over fsdp: ids gathered and rows exchanged (table-wise)
    or partial rows reduce-scattered and their gradients gathered (row-wise), the dense MLPs'
    gradients averaged over every rank, the tables' over dp (replicated across groups)."""
    group_batch = lever.global_batch // layout.dp  # the samples one table group serves
    tables, dim = model_config.num_tables, model_config.embedding_dim
    rows = group_batch * tables * dim * 4  # the looked-up vectors of the group's batch
    out = {}
    if layout.fsdp > 1:
        if layout.tables == "table_wise":
            out[("fsdp", "all_gather")] = (1, group_batch * tables * 8)
            out[("fsdp", "all_to_all")] = (2, 2 * rows)
        else:
            out[("fsdp", "reduce_scatter")] = (1, rows)
            out[("fsdp", "all_gather")] = (1, rows)
    counts = sample_counts(model_config)
    dense = counts.params - tables * model_config.rows_per_table * dim
    if layout.size > 1:
        out[("fsdp" if layout.fsdp > 1 else "dp", "all_reduce")] = (1, dense * 4)
    if layout.dp > 1:
        here = model_config.rows_per_table * dim * math.ceil(tables / layout.fsdp)
        out[("dp", "all_reduce")] = (1, here * 4 + dense * 4)
    return out
