"""Benchmark: how fast a labkit Cluster starts and answers, beside torch.multiprocessing.spawn.

    python bench/launch.py          # N = 1, 2, 4, 8; 3 repeats
    python bench/launch.py --quick  # about a minute

Both sides do the same work: start N ranks, join a gloo process group, run one no-op on every
rank. "cold" is the time until every rank has finished that no-op (torch already imported in
this process; each spawned rank must import it itself). "warm" is labkit's round trip of a
no-op run on ranks already up, against the only equivalent spawn has: starting again.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
import warnings
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import labkit

warnings.filterwarnings("ignore", category=labkit.OversubscriptionWarning)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawned_rank(rank: int, world_size: int, port: int, ready) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    dist.barrier()  # the no-op, made collective so that every rank is known to be up
    ready[rank] = time.time()
    dist.destroy_process_group()


def spawn_cold(world_size: int) -> float:
    ready = mp.get_context("spawn").Array("d", world_size)
    start = time.time()
    mp.spawn(_spawned_rank, args=(world_size, _free_port(), ready), nprocs=world_size)
    return max(ready) - start


def labkit_cold(world_size: int) -> float:
    start = time.time()
    cluster = labkit.Cluster(world_size, device="cpu", progress=False)
    cluster.run(lambda ctx: dist.barrier())
    elapsed = time.time() - start
    cluster.close()
    return elapsed


def labkit_warm(world_size: int, runs: int) -> float:
    with labkit.Cluster(world_size, device="cpu", progress=False) as cluster:
        cluster.run(lambda ctx: None)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            cluster.run(lambda ctx: None)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one repeat, about a minute")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    sizes = (1, 2, 4, 8)
    figures: dict = {"repeats": repeats, "cores": os.cpu_count()}
    print(f"{'N':>3} {'labkit cold s':>14} {'spawn cold s':>13} {'spawn/labkit':>13}")
    for n in sizes:
        ours = statistics.median(labkit_cold(n) for _ in range(repeats))
        theirs = statistics.median(spawn_cold(n) for _ in range(repeats))
        figures[f"cold_labkit_{n}_s"] = round(ours, 3)
        figures[f"cold_spawn_{n}_s"] = round(theirs, 3)
        print(f"{n:>3} {ours:>14.2f} {theirs:>13.2f} {theirs / ours:>12.1f}x")
    for side in ("labkit", "spawn"):
        ratio = figures[f"cold_{side}_8_s"] / figures[f"cold_{side}_1_s"]
        figures[f"cold_8_over_1_{side}"] = round(ratio, 2)
    warm = labkit_warm(4, runs=50 if args.quick else 200)
    figures["warm_noop_labkit_4_ms"] = round(warm * 1e3, 3)
    figures["warm_spawn_over_labkit_4"] = round(figures["cold_spawn_4_s"] / warm, 1)
    print(f"cold start, 8 ranks / 1 rank: labkit {figures['cold_8_over_1_labkit']}x, "
          f"spawn {figures['cold_8_over_1_spawn']}x")
    print(f"warm no-op run on 4 ranks: labkit {warm * 1e3:.2f} ms; spawn has no warm path, "
          f"starting again costs {figures['cold_spawn_4_s']:.2f} s "
          f"({figures['warm_spawn_over_labkit_4']}x)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
