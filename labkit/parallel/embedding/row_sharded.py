"""A table whose rows are split over ranks, with the lookup written out by hand.

Rank r holds rows [start_r, start_r + rows_r) (``torch.chunk`` on dim 0, as a DTensor
``Shard(0)``, so ``full_tensor()`` and checkpoints know the layout). Every rank sees every
sample's ids (all-gathered), looks up the ids that fall in its rows, writes zeros for the
others, and a reduce-scatter adds the ranks' partial rows and hands each rank those of its own
samples (``comm.scatter_rows``).

Why not DTensor's ``RowwiseParallel`` alone? It computes the same numbers (the tests check),
but in torch 2.13 the weight gradient it produces is *replicated*: every rank holds a gradient
as big as the whole table, the very thing row-wise sharding is for avoiding. Here the lookup
works on the local rows, so the gradient is this rank's rows only (``row_wise_dtensor``
trains with DTensor's version, for comparison).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Shard
from torch.nn import functional as F

from labkit.parallel.embedding.comm import scatter_rows


def row_range(rows: int, rank: int, world_size: int) -> tuple[int, int]:
    """(first row, row count) of ``rank``'s slice, as ``torch.chunk`` and DTensor cut it."""
    chunk = math.ceil(rows / world_size)
    start = min(rank * chunk, rows)
    return start, min(rows, start + chunk) - start


class RowShardedEmbedding(nn.Module):
    """``embedding``'s rows split over the 1-D ``mesh`` (a run's fsdp dimension); this rank's
    part, allocated on the table's device (the meta device, until the build fills it)."""

    def __init__(self, embedding: nn.Embedding, mesh):
        super().__init__()
        rows, dim = embedding.weight.shape
        self.world_size, self.group = mesh.size(), mesh.get_group()
        rank = mesh.get_local_rank()
        self.row_start, local_rows = row_range(rows, rank, self.world_size)
        if local_rows == 0:
            raise ValueError(f"{rows} rows leave rank {rank} of {self.world_size} without any: "
                             f"choose rows_per_table a multiple of the rank count")
        local = torch.empty(local_rows, dim, dtype=embedding.weight.dtype,
                            device=embedding.weight.device)
        self.weight = nn.Parameter(DTensor.from_local(
            local, mesh, [Shard(0)], run_check=False, shape=embedding.weight.shape,
            stride=embedding.weight.stride()))
        self.num_embeddings, self.embedding_dim = rows, dim

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = self.weight.to_local()  # (rows here, dim)
        here = (ids >= self.row_start) & (ids < self.row_start + local.shape[0])
        rows = F.embedding((ids - self.row_start) * here, local)  # (global batch, dim)
        rows = rows * here.unsqueeze(1).to(rows.dtype)  # zeros for rows held elsewhere
        return scatter_rows(rows, self.group)  # (batch, dim): own samples, summed
