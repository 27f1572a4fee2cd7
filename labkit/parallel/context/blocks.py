"""One block of attention and the online softmax that merges blocks: the arithmetic of ring
attention, without communication (Milakov & Gimelshein 2018, "Online normalizer calculation
for softmax"; FlashAttention's forward and backward, Dao et al. 2022).

A block is the attention of some queries to some keys: ``scores = q @ k^T / sqrt(d)``. Its
result is kept as ``(out, lse)``: the block's softmax-weighted values and the log of its
softmax denominator, per query. Two blocks of the same queries merge exactly into the
attention over both key sets, so a query's keys can arrive one block at a time.
"""

from __future__ import annotations

import math

import torch

# How a (query chunk, key chunk) pair is attended under a causal mask, from their positions
# in the whole sequence: keys before the queries in full, the diagonal chunk with a causal
# mask inside it, keys after the queries not at all.
FULL, DIAGONAL, SKIP = "full", "diagonal", "skip"
# Queries per tile: a block's scores are computed for this many queries at a time, so the
# largest temporary is (batch, heads, QUERY_TILE, k_len), not (batch, heads, q_len, k_len)
# (FlashAttention tiles the same way, in fast memory; here it bounds a rank's peak).
QUERY_TILE = 128


def pair_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    if not causal or k_chunk < q_chunk:
        return FULL
    return DIAGONAL if k_chunk == q_chunk else SKIP


def _scores(q: torch.Tensor, k: torch.Tensor, kind: str, row0: int = 0) -> torch.Tensor:
    """(batch, heads, q_len, k_len) scaled scores; in a diagonal block, -inf where a key
    comes after the query (``q`` holds the block's queries from row ``row0`` on)."""
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if kind == DIAGONAL:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1 + row0)
        scores = scores.masked_fill(above, float("-inf"))
    return scores


def _tiles(q_len: int, tile: int):
    return [(start, min(start + tile, q_len)) for start in range(0, q_len, tile)]


def block_forward(q, k, v, kind: str, tile: int = QUERY_TILE):
    """The block's (out (batch, heads, q_len, d_head), lse (batch, heads, q_len)),
    ``tile`` queries at a time."""
    outs, lses = [], []
    for start, end in _tiles(q.shape[-2], tile):
        scores = _scores(q[..., start:end, :], k, kind, start)
        lses.append(torch.logsumexp(scores, dim=-1))
        outs.append(torch.softmax(scores, dim=-1) @ v)
        del scores
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def merge(out, lse, block_out, block_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A (``out``, ``lse``) and keys B (the block's) -> over A and B.

    softmax over A u B weighs A's result by sum_A / (sum_A + sum_B) = exp(lse_A - lse_AB):
    the running result is rescaled, never recomputed. ``lse`` = -inf means no keys yet.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new_lse).unsqueeze(-1) + \
        block_out * torch.exp(block_lse - new_lse).unsqueeze(-1)
    return out, new_lse


def block_backward(q, k, v, kind: str, lse, grad_out, delta, tile: int = QUERY_TILE):
    """Gradients of one block given the *whole* attention's ``lse`` and ``delta`` =
    rowsum(grad_out * out) (batch, heads, q_len): (dq, dk, dv) of this block's share,
    ``tile`` queries at a time.

    With P = exp(scores - lse) the block's part of the final softmax, dV = P^T dO,
    dS = P * (dO V^T - delta), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    dqs, dk, dv = [], torch.zeros_like(k), torch.zeros_like(v)
    for start, end in _tiles(q.shape[-2], tile):
        rows = slice(start, end)
        p = torch.exp(_scores(q[..., rows, :], k, kind, start) - lse[..., rows].unsqueeze(-1))
        dv += p.transpose(-2, -1) @ grad_out[..., rows, :]  # p: (batch, heads, tile, k_len)
        ds = p * (grad_out[..., rows, :] @ v.transpose(-2, -1) - delta[..., rows].unsqueeze(-1))
        del p
        dqs.append(ds @ k * scale)
        dk += ds.transpose(-2, -1) @ q[..., rows, :] * scale
        del ds
    return torch.cat(dqs, dim=-2), dk, dv
