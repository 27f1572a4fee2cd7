"""Which tokens each rank of a context-parallel group holds.

The sequence is cut into 2N chunks; rank i holds chunks i and 2N-1-i (in that order). Under
a causal mask a query attends to the keys before it, so the last chunk does the most work
and the first the least: pairing chunk i with chunk 2N-1-i gives every rank the same work
(Megatron-LM's and torchtitan's load-balanced context parallelism).
"""

from __future__ import annotations

import torch


def rank_chunks(rank: int, cp: int) -> tuple[int, int]:
    """The two chunk indices (of 2 * cp) that rank ``rank`` of the cp group holds."""
    return rank, 2 * cp - 1 - rank


def positions(rank: int, cp: int, seq_len: int) -> torch.Tensor:
    """The positions in the whole sequence of this rank's local tokens, in local order:
    (2 * seq_len / (2 * cp),) = (seq_len / cp,)."""
    if seq_len % (2 * cp):
        raise ValueError(f"a sequence of {seq_len} tokens does not cut into 2 x cp = {2 * cp} "
                         f"equal chunks: choose seq_len a multiple of {2 * cp}")
    chunk = seq_len // (2 * cp)
    return torch.cat([torch.arange(c * chunk, (c + 1) * chunk) for c in rank_chunks(rank, cp)])


def shard_sequence(value, rank: int, cp: int, dim: int = 1):
    """This rank's tokens of a tensor (or a tuple of tensors) along ``dim``."""
    if isinstance(value, tuple):
        return tuple(shard_sequence(v, rank, cp, dim) for v in value)
    index = positions(rank, cp, value.shape[dim]).to(value.device)
    return value.index_select(dim, index)


def unshard_sequence(pieces: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Every rank's local tensor (in cp-rank order) back into the whole sequence."""
    cp = len(pieces)
    seq_len = sum(p.shape[dim] for p in pieces)
    order = torch.cat([positions(r, cp, seq_len) for r in range(cp)])
    whole = torch.cat(pieces, dim=dim)
    return whole.index_select(dim, torch.argsort(order).to(whole.device))
