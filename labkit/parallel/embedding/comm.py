"""The collectives of embedding sharding, each a small named operation.

A data-parallel rank holds the row ids of its own slice of the batch; a table lives on one
rank of the group that shares the tables (the run's fsdp dimension). So before the lookups the
ids must reach the tables, and after them the looked-up rows must come back to the ranks whose
samples they belong to (DLRM's "butterfly shuffle", Naumov et al. 2019, section 4; TorchRec
calls the two steps input and output distribution). Every collective here runs on that group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def gather_ids(local_ids: torch.Tensor, group) -> torch.Tensor:
    """All-gather forward, nothing backward (ids are integers, they have no gradient).

    (b, num_tables) ids of this rank's samples -> (group size * b, num_tables), every group
    rank's samples in rank order. labkit's data are deterministic, so every rank could make
    the whole batch itself; a real input pipeline gives each rank only its own samples, so the
    ids are communicated here, and counted. TorchRec sends each table's ids only to its owner
    (an all-to-all); all-gathering them all is simpler and costs little: ids are a few bytes
    per sample and table, the looked-up rows ``embedding_dim`` floats.
    """
    size = dist.get_world_size(group)
    if size == 1:
        return local_ids
    out = local_ids.new_empty((size * local_ids.shape[0], *local_ids.shape[1:]))
    dist.all_gather_single(out, local_ids.contiguous(), group=group)
    return out


class _AllToAll(torch.autograd.Function):
    """All-to-all forward; backward, the same exchange in reverse (each gradient goes back to
    the rank that sent the row)."""

    @staticmethod
    def forward(ctx, tensor, send_counts: list[int], receive_counts: list[int], group):
        ctx.counts, ctx.group = (send_counts, receive_counts), group
        out = tensor.new_empty((sum(receive_counts), *tensor.shape[1:]))
        dist.all_to_all_single(out, tensor.contiguous(), output_split_sizes=receive_counts,
                               input_split_sizes=send_counts, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        send_counts, receive_counts = ctx.counts
        out = grad.new_empty((sum(send_counts), *grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), output_split_sizes=send_counts,
                               input_split_sizes=receive_counts, group=ctx.group)
        return out, None, None, None


class _ReduceScatterRows(torch.autograd.Function):
    """Reduce-scatter (sum) along dim 0 forward; all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, rows, group):
        ctx.group, size = group, dist.get_world_size(group)
        out = rows.new_empty((rows.shape[0] // size, *rows.shape[1:]))
        dist.reduce_scatter_single(out, rows.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        size = dist.get_world_size(ctx.group)
        out = grad.new_empty((grad.shape[0] * size, *grad.shape[1:]))
        dist.all_gather_single(out, grad.contiguous(), group=ctx.group)
        return out, None


def exchange_lookups(looked_up: torch.Tensor, send_counts: list[int],
                     receive_counts: list[int], group) -> torch.Tensor:
    """All-to-all forward, all-to-all backward (the same exchange in reverse).

    Forward: the flat ``looked_up`` rows are cut into ``send_counts`` pieces, piece r going to
    rank r (the rows of rank r's samples); the result is what every rank sent here, in rank
    order (``receive_counts`` elements from each). Backward: each rank's gradient for the rows
    it received goes back to the table that produced them.
    """
    return _AllToAll.apply(looked_up, send_counts, receive_counts, group)


def scatter_rows(partial_rows: torch.Tensor, group) -> torch.Tensor:
    """Reduce-scatter forward, all-gather backward (row-wise sharding).

    Forward: (global batch, dim) rows that this rank's slice of a table produced (zeros for
    ids held elsewhere) are summed over ranks, and rank r keeps the rows of its own samples:
    (batch, dim). Backward: every rank's gradient for its samples is all-gathered, so that each
    rank computes the gradient of its own table rows from every sample that used them.
    """
    if dist.get_world_size(group) == 1:
        return partial_rows
    return _ReduceScatterRows.apply(partial_rows, group)
