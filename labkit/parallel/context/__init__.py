"""Context parallelism: each rank holds a slice of the sequence; attention's keys and values
go round a ring (``ring.py``, written from send/recv), merged with the online softmax
(``blocks.py``); rank i holds chunks i and 2N-1-i of the sequence (``sharding.py``)."""

from labkit.parallel.context.blocks import block_backward, block_forward, merge, pair_kind
from labkit.parallel.context.ring import RingAttention, ring_attention, ring_forward
from labkit.parallel.context.sharding import (
    positions,
    rank_chunks,
    shard_sequence,
    unshard_sequence,
)

__all__ = ["RingAttention", "block_backward", "block_forward", "merge", "pair_kind",
           "positions", "rank_chunks", "ring_attention", "ring_forward", "shard_sequence",
           "unshard_sequence"]
