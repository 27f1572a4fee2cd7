"""Ring attention shown on the ranks: which key/value block each rank holds at each step,
noted by the ring itself as it runs (``labkit/parallel/context/observe.py``)."""

from __future__ import annotations


def _schedule_on_rank(ctx, seq_len: int) -> list:
    import torch
    import torch.distributed as dist

    from labkit.parallel.context.observe import observed_ring_forward
    from labkit.parallel.context.sharding import shard_sequence

    q = shard_sequence(torch.randn(1, 1, seq_len, 4), ctx.rank, ctx.world_size, dim=2)
    schedule: list = []
    observed_ring_forward(q, q, q, dist.group.WORLD, True, schedule=schedule)
    return [{"step": step, "holds": source, "pairs": [list(p) for p in pairs]}
            for step, source, pairs in schedule]


def ring_schedule(cluster) -> list[list[dict]]:
    """[rank][step] -> {"step", "holds": whose key/value block, "pairs": [(local query
    chunk, local key chunk, "full" | "diagonal")]}, from a causal ring on every rank."""
    return list(cluster.run(_schedule_on_rank, 4 * cluster.world_size))


def check_lesson_ranks(ranks: int, seq_options, n_experts: int, global_batch: int) -> None:
    """Notebook 08 runs cp, dp and ep all over its ``ranks``: refuse, before anything runs, a
    count that cannot (1 rank compares nothing and has no dp group; 3 cuts neither 256
    tokens into 2 x 3 chunks nor 4 experts over 3 ranks)."""
    def fits(n: int) -> list[str]:
        problems = [] if n >= 2 else ["at least 2 ranks (one rank parallelises nothing)"]
        problems += [f"seq_len {s} a multiple of 2 x cp = {2 * n}" for s in seq_options
                     if s % (2 * n)]
        if n_experts % n:
            problems.append(f"n_experts {n_experts} a multiple of ep = {n}")
        if global_batch % n:
            problems.append(f"the batch of {global_batch} a multiple of dp = {n}")
        return problems

    problems = fits(ranks)
    if problems:
        good = [n for n in (2, 4, 8) if not fits(n)]
        raise ValueError(f"world_size={ranks} cannot run this lesson: it needs "
                         f"{'; '.join(problems)}. Choose world_size="
                         f"{' or '.join(map(str, good)) or 2} (with these seq_options and "
                         f"n_experts)")
