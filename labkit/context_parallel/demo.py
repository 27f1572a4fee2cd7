"""Ring attention shown on the ranks: which key/value block each rank holds at each step,
recorded by the ring itself (``ring_forward(..., schedule=...)``)."""

from __future__ import annotations


def _schedule_on_rank(ctx, seq_len: int) -> list:
    import torch
    import torch.distributed as dist

    from labkit.context_parallel.ring import ring_forward
    from labkit.context_parallel.sharding import shard_sequence

    q = shard_sequence(torch.randn(1, 1, seq_len, 4), ctx.rank, ctx.world_size, dim=2)
    schedule: list = []
    ring_forward(q, q, q, dist.group.WORLD, True, schedule=schedule)
    return [{"step": step, "holds": source, "pairs": [list(p) for p in pairs]}
            for step, source, pairs in schedule]


def ring_schedule(cluster) -> list[list[dict]]:
    """[rank][step] -> {"step", "holds": whose key/value block, "pairs": [(local query
    chunk, local key chunk, "full" | "diagonal")]}, from a causal ring on every rank."""
    return list(cluster.run(_schedule_on_rank, 4 * cluster.world_size))
