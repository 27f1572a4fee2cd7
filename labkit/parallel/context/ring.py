"""Ring attention, written from send/recv (Liu et al. 2023, "Ring Attention with Blockwise
Transformers"; load-balanced causal split as in Megatron-LM's context parallelism).

For teaching, and what runs on CPU: PyTorch's own engine,
``torch.distributed.tensor.experimental.context_parallel``, refuses CPU attention in torch
2.13 (``aten._scaled_dot_product_flash_attention_for_cpu`` has no sharding strategy); on
CUDA ranks training uses PyTorch's engine unless ``TrainConfig(cp_engine="ring")``
(``engine.py``).

Each of the N ranks of a cp group holds the queries, keys and values of its own tokens
(two chunks of the sequence, ``sharding.py``). Forward: N steps; at step s a rank holds the
keys and values of rank (r - s) mod N, attends its queries to them (the pairs the causal
mask allows) and merges the block into its running result with the online softmax, while
the block moves on to rank r + 1. Backward: the same ring again; each key/value block
travels with the gradient of its keys and values, which every rank adds to, and comes home
after one more hop. Every rank ends with the exact attention of its queries over the whole
sequence, and the exact gradients of its own q, k, v.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.parallel.context.blocks import SKIP, block_backward, block_forward, merge, pair_kind
from labkit.parallel.context.sharding import rank_chunks


def start_ring_pass(tensor: torch.Tensor, group):
    """Start sending ``tensor`` to the next rank of the ring and receiving the previous
    rank's into a new tensor (one send and one receive issued together, so no rank waits
    on another's send). Returns (the receive buffer, the works to wait for)."""
    me, size = dist.get_rank(group), dist.get_world_size(group)
    received = torch.empty_like(tensor)
    ops = [dist.P2POp(dist.isend, tensor, dist.get_global_rank(group, (me + 1) % size), group),
           dist.P2POp(dist.irecv, received, dist.get_global_rank(group, (me - 1) % size), group)]
    return received, dist.batch_isend_irecv(ops)


def ring_pass(tensor: torch.Tensor, group) -> torch.Tensor:
    """Send ``tensor`` to the next rank, return the previous rank's (waits for both)."""
    received, works = start_ring_pass(tensor, group)
    for work in works:
        work.wait()
    return received


def _pairs(rank: int, source: int, size: int, causal: bool):
    """(local query half, local key half, kind) for the pairs rank ``rank`` computes while
    it holds rank ``source``'s keys: each local half is one chunk of the sequence."""
    mine, theirs = rank_chunks(rank, size), rank_chunks(source, size)
    for qi, q_chunk in enumerate(mine):
        for ki, k_chunk in enumerate(theirs):
            kind = pair_kind(q_chunk, k_chunk, causal)
            if kind != SKIP:
                yield qi, ki, kind


def _halves(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return t.chunk(2, dim=-2)  # the two chunks of the local sequence (dim -2)


def ring_forward(q, k, v, group, causal: bool):
    """Local (out, lse) of the whole sequence's attention; q, k, v (batch, heads, L, d)
    with L = 2 chunks."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    out = torch.zeros_like(q)
    lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
    outs, lses = list(_halves(out)), list(lse.chunk(2, dim=-1))
    qs, kv = _halves(q), torch.stack([k, v])  # kv (2, batch, heads, L, d): one message
    for step in range(size):
        source = (rank - step) % size
        if step < size - 1:  # the next step's block travels while this one computes
            following, works = start_ring_pass(kv, group)
        ks, vs = _halves(kv[0]), _halves(kv[1])
        for qi, ki, kind in _pairs(rank, source, size, causal):
            block = block_forward(qs[qi], ks[ki], vs[ki], kind)
            outs[qi], lses[qi] = merge(outs[qi], lses[qi], *block)
        if step < size - 1:
            for work in works:
                work.wait()
            kv = following
    return torch.cat(outs, dim=-2), torch.cat(lses, dim=-1)


def ring_backward(q, k, v, out, lse, grad_out, group, causal: bool):
    """(dq, dk, dv) of this rank's q, k, v: keys, values and their gradients go round."""
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    delta = (grad_out * out).sum(-1)  # (batch, heads, L)
    qs, dos = _halves(q), _halves(grad_out)
    lses, deltas = lse.chunk(2, dim=-1), delta.chunk(2, dim=-1)
    dq = [torch.zeros_like(h) for h in qs]
    # (4, batch, heads, L, d): k, v and the gradients of k and v gathered so far
    travel = torch.stack([k, v, torch.zeros_like(k), torch.zeros_like(v)])
    for step in range(size):
        source = (rank - step) % size
        ks, vs = _halves(travel[0]), _halves(travel[1])
        dks, dvs = _halves(travel[2]), _halves(travel[3])
        for qi, ki, kind in _pairs(rank, source, size, causal):
            dqb, dkb, dvb = block_backward(qs[qi], ks[ki], vs[ki], kind, lses[qi],
                                           dos[qi], deltas[qi])
            dq[qi] += dqb
            dks[ki].add_(dkb)  # views into travel: the gradients ride with their block
            dvs[ki].add_(dvb)
        if step < size - 1:
            travel = ring_pass(travel, group)
    # The block in hand belongs to rank + 1: one more hop takes every gradient home.
    grads = travel[2:] if size == 1 else ring_pass(travel[2:].contiguous(), group)
    return torch.cat(dq, dim=-2), grads[0], grads[1]


class RingAttention(torch.autograd.Function):
    """Exact attention of this rank's queries over the whole sequence, its keys and values
    passed round the cp group (forward and backward each one lap of the ring)."""

    @staticmethod
    def forward(ctx, q, k, v, group, causal):
        out, lse = ring_forward(q, k, v, group, causal)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.causal = group, causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ring_backward(q, k, v, out, lse, grad_out.contiguous(), ctx.group,
                                   ctx.causal)
        return dq, dk, dv, None, None


def ring_attention(q, k, v, group=None, causal: bool = True) -> torch.Tensor:
    """Attention of the local (batch, heads, L, d_head) q, k, v of a load-balanced sequence
    shard over the whole sequence held by ``group``: equal to
    ``F.scaled_dot_product_attention`` on the whole sequence, this rank's tokens of it."""
    group = group or dist.group.WORLD
    if q.shape[-2] % 2:
        raise ValueError(f"a rank holds two equal chunks of the sequence; its {q.shape[-2]} "
                         "tokens do not split in two: choose seq_len a multiple of 2 x cp")
    return RingAttention.apply(q, k, v, group, causal)
