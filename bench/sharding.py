"""Benchmark: what sharding saves in memory and costs in time, and the recommender sharded.

    python bench/sharding.py          # about a minute on 2 cores
    python bench/sharding.py --quick  # about 20 seconds

1. DDP / ZeRO-1 / FSDP on 1, 2 and 4 ranks (4 oversubscribes a 2-core machine: said in the
   output): per-rank peak memory measured, the estimate beside it, the median step time and
   its exposed communication, bytes per step. Ratios to DDP at the same rank count are
   measured side by side in the same run.
2. The recommender (the zoo's DLRM with tables much larger than its dense part): samples per
   second on one device vs table-wise and row-wise sharding on 2 ranks, same global batch.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json

import labkit
from labkit.models import DLRMConfig, MLPConfig
from labkit.training import TrainConfig


def sharding(cluster, config, world_sizes) -> dict:
    comparison = labkit.compare_sharding(cluster, config, world_sizes=world_sizes)
    out = {}
    for row in comparison.rows:
        ddp = comparison.row("ddp", row.world_size)
        out[f"{row.strategy}_x{row.world_size}"] = {
            "peak_bytes": row.peak_bytes, "estimated_bytes": row.estimated_bytes,
            "estimate_error": round(row.estimate_error, 4),
            "memory_vs_ddp": round(row.peak_bytes / ddp.peak_bytes, 3),
            "step_ms": round(row.step_s * 1e3, 2), "comm_ms": round(row.comm_s * 1e3, 2),
            "time_vs_ddp": round(row.step_s / ddp.step_s, 3), "comm_bytes": row.comm_bytes,
            "comm_wire_bytes": round(row.comm_wire_bytes),
            "oversubscribed": row.oversubscribed}
        figures = out[f"{row.strategy}_x{row.world_size}"]
        print(f"{row.strategy:6s} x{row.world_size}: peak {labkit.format_bytes(row.peak_bytes)} "
              f"(estimate {100 * row.estimate_error:.1f}% off, {figures['memory_vs_ddp']:.2f}x "
              f"DDP), step {figures['step_ms']:.1f} ms ({figures['comm_ms']:.1f} waiting, "
              f"{figures['time_vs_ddp']:.2f}x DDP), "
              f"{labkit.format_bytes(row.comm_wire_bytes)} sent per rank per step"
              f"{' [oversubscribed]' if row.oversubscribed else ''}")
    return out


def recommender(cluster, config, steps: int) -> dict:
    """Samples/s of the recommender: one device vs sharded over the cluster's ranks."""
    runs = {}
    original = cluster.world_size
    try:
        cluster.resize(1)
        runs["single_x1"] = labkit.train(cluster, config, steps=steps, estimate=False)
        cluster.resize(original)
        for strategy in ("table_wise", "row_wise"):
            runs[f"{strategy}_x{original}"] = labkit.train(cluster, config, strategy=strategy,
                                                           steps=steps, estimate=False)
    finally:
        if cluster.world_size != original:
            cluster.resize(original)
    base = runs["single_x1"].samples_per_s
    out = {}
    for name, report in runs.items():
        out[name] = {"samples_per_s": round(report.samples_per_s, 1),
                     "vs_one_device": round(report.samples_per_s / base, 3),
                     "peak_bytes": max(report.peak_bytes),
                     "oversubscribed": report.oversubscribed}
        print(f"recommender {name}: {report.samples_per_s:.0f} samples/s "
              f"({report.samples_per_s / base:.2f}x one device), peak per rank "
              f"{labkit.format_bytes(max(report.peak_bytes))}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about 20 seconds")
    args = parser.parse_args()
    world_sizes = (1, 2) if args.quick else (1, 2, 4)
    mlp = TrainConfig(model=MLPConfig(d_in=256, d_hidden=512 if args.quick else 1024,
                                      n_layers=6), global_batch=256, steps=6 if args.quick else 12)
    dlrm = TrainConfig(model=DLRMConfig(num_tables=8, rows_per_table=20_000, embedding_dim=32),
                       global_batch=2048, optimizer="adam")
    with labkit.Cluster(2, progress=False) as cluster:
        figures = {"sharding_mlp": sharding(cluster, mlp, world_sizes),
                   "recommender": recommender(cluster, dlrm, 6 if args.quick else 12)}
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
