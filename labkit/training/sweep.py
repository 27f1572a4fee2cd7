"""One way to train a grid of runs: every cell checked before the first one starts, each run
at its rank count, and the cluster put back as it was, whatever happens.

    results = run_cells(cluster, [(1, config), (2, config), (4, config)], labkit.train)

``compare_sharding``, ``sweep_boundary``, ``scaling_sweep`` and ``compare_with_ddp`` are all
this, with their own cells and their own ``run``.
"""

from __future__ import annotations

from labkit.training.api import checked


def run_cells(cluster, cells: list[tuple[int, object]], run) -> list:
    """``run(cluster, resolved)`` for every (world size, TrainConfig) cell, in order of first
    appearance of each world size (the cluster is resized once per size), returned in the
    cells' order. Each cell is resolved once, before any of them starts (ValueError for one
    that cannot run), and ``run`` gets that ``Run`` (``labkit.train`` and
    ``labkit.estimate_memory`` take it as it is)."""
    runs = [checked(cluster, config, world_size) for world_size, config in cells]
    sizes = list(dict.fromkeys(world_size for world_size, _ in cells))
    results: list = [None] * len(cells)
    if not sizes:
        return results
    with cluster.resized(sizes[0]):
        for size in sizes:
            if cluster.world_size != size:
                cluster.resize(size)
            for i, (world_size, _) in enumerate(cells):
                if world_size == size:
                    results[i] = run(cluster, runs[i])
    return results
