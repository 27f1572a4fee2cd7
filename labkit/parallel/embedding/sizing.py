"""What a DLRM costs to train, part by part, and the plan for training it on N ranks."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.models import build_model
from labkit.models.optim import weight_dtype
from labkit.parallel.embedding.placement import TablePlan, all_row_wise, plan_tables
from labkit.runtime.costs import training_bytes
from labkit.runtime.memory.units import format_bytes

# Temporaries of the size of the parameter being updated, alive at once during the update
# (measured: labkit's Adam updates one tensor at a time, foreach=False, and its peak holds three
# such temporaries of the largest table; plain SGD updates in place).
OPTIMIZER_TEMPORARIES = {"adam": 3, "adamw": 3, "sgd": 0}
# Activations per sample of the global batch, in units of (tables x dim) values: the looked-up
# rows, what the exchange received, their gradients; the interaction and the MLPs' hidden
# layers come on top. A rough allowance, not a trace.
LOOKUP_BUFFERS = 3


def dlrm_plan(config, world_size: int, capacity_bytes: int | None = None,
              row_wise: bool | str = False) -> TablePlan:
    """The plan for training ``config`` (a TrainConfig of the zoo's DLRM) on ``world_size``
    ranks: table-wise where tables fit (``row_wise``: every table split by rows; a string
    says why).

    The reserve per rank counts the dense part's training cost and the larger of two peaks
    that do not happen together: activations and lookups in flight (backward), and the
    optimizer's temporaries for the largest table it updates (a row slice, when every table is
    split by rows).
    """
    model = config.model
    if model.name != "dlrm":
        raise ValueError(f"tables are planned for the zoo's 'dlrm', not {model.name!r}")
    element = _element_size(weight_dtype(config.precision))
    meta = build_model(model, "meta")
    dense = sum(p.numel() for m in (meta.bottom, meta.top) for p in m.parameters()) * element
    weights = [model.rows_per_table * model.embedding_dim * element] * model.num_tables
    activations = config.global_batch * (LOOKUP_BUFFERS * model.num_tables * model.embedding_dim
                                         + (model.num_tables + 1) ** 2
                                         + model.bottom_hidden + model.top_hidden)
    largest = -(-model.rows_per_table // world_size) if row_wise else model.rows_per_table
    temporaries = (OPTIMIZER_TEMPORARIES[config.optimizer] * largest * model.embedding_dim)
    reserved = training_bytes(dense, config.optimizer) + max(activations, temporaries) * element
    costs = [training_bytes(w, config.optimizer) for w in weights]
    rows = [model.rows_per_table] * model.num_tables
    if row_wise:
        return all_row_wise(costs, world_size, rows, reserved, capacity_bytes, row_wise
                            if isinstance(row_wise, str) else "row-wise sharding asked for")
    return plan_tables(costs, world_size, capacity_bytes, reserved, rows)


def _element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


@dataclass
class ModelParts:
    """Bytes of a DLRM's tables and of its dense part: weights, and what training them costs."""

    table_weights: int
    dense_weights: int
    optimizer: str

    @property
    def table_training(self) -> int:
        return training_bytes(self.table_weights, self.optimizer)

    @property
    def dense_training(self) -> int:
        return training_bytes(self.dense_weights, self.optimizer)

    def to_dict(self) -> dict:
        return {"table_weights": self.table_weights, "dense_weights": self.dense_weights,
                "table_training": self.table_training, "dense_training": self.dense_training}

    def _repr_html_(self) -> str:
        share = 100 * self.table_weights / (self.table_weights + self.dense_weights)
        return (f"<table><tr><th></th><th>weights</th><th>to train with {self.optimizer} "
                f"(weights, gradients, optimizer state)</th></tr>"
                f"<tr><td>embedding tables</td><td>{format_bytes(self.table_weights)}</td>"
                f"<td>{format_bytes(self.table_training)}</td></tr>"
                f"<tr><td>dense MLPs</td><td>{format_bytes(self.dense_weights)}</td>"
                f"<td>{format_bytes(self.dense_training)}</td></tr></table>"
                f"tables: {share:.1f}% of the weights")


def model_parts(config) -> ModelParts:
    """Tables vs dense part of ``config`` (a TrainConfig of the zoo's DLRM), counted from a
    model built on the meta device (nothing allocated)."""
    element = _element_size(weight_dtype(config.precision))
    meta = build_model(config.model, "meta")
    tables = sum(p.numel() for p in meta.tables.parameters()) * element
    dense = sum(p.numel() for m in (meta.bottom, meta.top) for p in m.parameters()) * element
    return ModelParts(tables, dense, config.optimizer)
