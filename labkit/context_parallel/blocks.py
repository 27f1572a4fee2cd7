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


def pair_kind(q_chunk: int, k_chunk: int, causal: bool) -> str:
    if not causal or k_chunk < q_chunk:
        return FULL
    return DIAGONAL if k_chunk == q_chunk else SKIP


def _scores(q: torch.Tensor, k: torch.Tensor, kind: str) -> torch.Tensor:
    """(batch, heads, q_len, k_len) scaled scores, -inf above the diagonal of a diagonal
    block (q_len == k_len there)."""
    scores = q @ k.transpose(-2, -1) * (1.0 / math.sqrt(q.shape[-1]))
    if kind == DIAGONAL:
        above = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return scores


def block_forward(q, k, v, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The block's (out (batch, heads, q_len, d_head), lse (batch, heads, q_len))."""
    scores = _scores(q, k, kind)
    lse = torch.logsumexp(scores, dim=-1)
    return torch.softmax(scores, dim=-1) @ v, lse


def merge(out, lse, block_out, block_lse) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention over keys A (``out``, ``lse``) and keys B (the block's) -> over A and B.

    softmax over A u B weighs A's result by sum_A / (sum_A + sum_B) = exp(lse_A - lse_AB):
    the running result is rescaled, never recomputed. ``lse`` = -inf means no keys yet.
    """
    new_lse = torch.logaddexp(lse, block_lse)
    out = out * torch.exp(lse - new_lse).unsqueeze(-1) + \
        block_out * torch.exp(block_lse - new_lse).unsqueeze(-1)
    return out, new_lse


def block_backward(q, k, v, kind: str, lse, grad_out, delta):
    """Gradients of one block given the *whole* attention's ``lse`` and ``delta`` =
    rowsum(grad_out * out) (batch, heads, q_len): (dq, dk, dv) of this block's share.

    With P = exp(scores - lse) the block's part of the final softmax, dV = P^T dO,
    dS = P * (dO V^T - delta), dQ = dS K / sqrt(d), dK = dS^T Q / sqrt(d).
    """
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = torch.exp(_scores(q, k, kind) - lse.unsqueeze(-1))  # (batch, heads, q_len, k_len)
    dv = p.transpose(-2, -1) @ grad_out
    ds = p * (grad_out @ v.transpose(-2, -1) - delta.unsqueeze(-1))
    return ds @ k * scale, ds.transpose(-2, -1) @ q * scale, dv
