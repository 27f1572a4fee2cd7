"""Context parallelism applied to a model (the model's plan names its attention and its
position embedding), and the batch it trains on.

What changes on a rank of a cp group of N:
* its batch holds 2 of the 2N chunks of every sequence (``sharding.py``; the training loop
  cuts them, targets with inputs), so every activation is 1/N of one device's;
* the position embedding is looked up at the tokens' places in the whole sequence;
* attention is ring attention over the cp group (``ring.py``);
* the loss is the mean over this rank's tokens, so the gradient of the whole batch's mean is
  the mean of the cp ranks' gradients: one AllReduce per parameter after backward, over cp
  (as data parallelism averages over dp; the two compose, each over its own group: the
  build's gradient sync lists one step for each, ``labkit/training/build/sync.py``).
"""

from __future__ import annotations

from functools import partial

from torch import nn

from labkit.parallel.context.ring import ring_attention
from labkit.parallel.context.sharding import positions, shard_sequence


def ring_attention_for(group):
    """The attention a cp rank runs instead of ``F.scaled_dot_product_attention(q, k, v,
    is_causal=True)``: same arguments, (batch, heads, local seq, d_head)."""
    return partial(ring_attention, group=group, causal=True)


def global_positions(embedding: nn.Module, rank: int, cp: int) -> None:
    """Make a position embedding look up the whole sequence's positions of this rank's
    tokens: its input ``arange(local_len)`` becomes ``positions(rank, cp, local_len x cp)``."""

    def hook(module, args):
        (local,) = args  # (local_len,): 0, 1, ..., local_len - 1
        return (positions(rank, cp, local.shape[0] * cp).to(local.device),)

    embedding.register_forward_pre_hook(hook)


def apply_cp(plan, model: nn.Module, group, rank: int, degree: int,
             engine: str = "ring") -> None:
    """Context parallelism on a whole model (``plan.cp_parts`` names what changes): with
    ``engine`` "ring" its attention becomes ring attention over the cp group; with "torch"
    SDPA stays and PyTorch's ``context_parallel`` swaps it in during each step. Both engines
    look positions up in head-tail order."""
    attentions, position_embedding = plan.cp_parts(model)
    if engine == "ring":
        for holder in attentions:
            holder.attention = ring_attention_for(group)
    global_positions(position_embedding, rank, degree)


def shard_batch(batch, rank: int, cp: int):
    """This cp rank's tokens of a (inputs, targets) batch of (batch, seq) tensors."""
    return batch if cp == 1 else shard_sequence(batch, rank, cp, dim=1)
