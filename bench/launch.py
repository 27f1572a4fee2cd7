"""Benchmark: how fast a labkit Cluster starts and answers, beside torch.multiprocessing.spawn
and beside a fork launcher (accelerate's ``notebook_launcher``, when accelerate is installed).

    python bench/launch.py          # N = 1, 2, 4, 8; 3 repeats
    python bench/launch.py --quick  # N = 1, 2, 4; one repeat; about a minute

Every side does the same work, from a process that has already imported torch (as a notebook
kernel has): start N ranks, join a gloo process group, finish one AllReduce on every rank.
"cold" is the time until every rank has finished it. labkit forks its launcher from this
process when that is safe (labkit/runtime/cluster/launcher.py); spawn starts fresh interpreters that
import torch themselves; the fork launcher forks this process for every rank. "warm" is
labkit's round trip of a no-op run on ranks already up, against the only equivalent the
others have: starting again. The last line printed is one JSON object of the figures.
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


def rank_counts(quick: bool) -> tuple[int, ...]:
    return (1, 2, 4) if quick else (1, 2, 4, 8)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _all_reduce_once() -> None:
    tensor = torch.ones(1)
    dist.all_reduce(tensor)  # the work every side does: every rank is known to be up


def _spawned_rank(rank: int, world_size: int, port: int, ready) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=timedelta(seconds=120))
    _all_reduce_once()
    ready[rank] = time.time()
    dist.destroy_process_group()


def spawn_cold(world_size: int) -> float:
    ready = mp.get_context("spawn").Array("d", world_size)
    start = time.time()
    mp.spawn(_spawned_rank, args=(world_size, _free_port(), ready), nprocs=world_size)
    return max(ready) - start


def _forked_rank(ready) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=120))  # env:// from launcher
    _all_reduce_once()
    ready[dist.get_rank()] = time.time()
    dist.destroy_process_group()


def fork_launcher_cold(world_size: int) -> float | None:
    """accelerate's notebook_launcher (fork), or None if accelerate is not installed."""
    try:
        from accelerate import notebook_launcher
    except ImportError:
        return None
    ready = mp.get_context("fork").Array("d", world_size)
    start = time.time()
    if world_size == 1:  # the launcher runs a single process in this one: fork one ourselves
        pid = os.fork()
        if pid == 0:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()),
                              RANK="0", WORLD_SIZE="1")
            try:
                _forked_rank(ready)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
    else:
        notebook_launcher(_forked_rank, (ready,), num_processes=world_size,
                          use_port=str(_free_port()))
    return max(ready) - start


def labkit_cold(world_size: int) -> float:
    start = time.time()
    cluster = labkit.Cluster(world_size, device="cpu", progress=False)
    cluster.run(lambda ctx: _all_reduce_once())
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
    parser.add_argument("--quick", action="store_true",
                        help="N = 1, 2, 4 and one repeat: about a minute")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    sizes = rank_counts(args.quick)
    figures: dict = {"repeats": repeats, "cores": os.cpu_count(),
                     "launcher": labkit.runtime.cluster.launcher.choose_launcher("auto", "cpu")}
    print(f"{'N':>3} {'labkit cold s':>14} {'fork cold s':>12} {'spawn cold s':>13} "
          f"{'labkit/fork':>12} {'spawn/labkit':>13}")
    for n in sizes:
        ours = statistics.median(labkit_cold(n) for _ in range(repeats))
        forked = [fork_launcher_cold(n) for _ in range(repeats)]
        theirs = statistics.median(spawn_cold(n) for _ in range(repeats))
        fork_s = None if None in forked else statistics.median(forked)
        figures[f"cold_labkit_{n}_s"] = round(ours, 3)
        figures[f"cold_spawn_{n}_s"] = round(theirs, 3)
        fork_text, ratio_text = "skipped", "-"
        if fork_s is not None:
            figures[f"cold_fork_{n}_s"] = round(fork_s, 3)
            figures[f"cold_labkit_over_fork_{n}"] = round(ours / fork_s, 2)
            fork_text, ratio_text = f"{fork_s:.2f}", f"{ours / fork_s:.2f}x"
        print(f"{n:>3} {ours:>14.2f} {fork_text:>12} {theirs:>13.2f} {ratio_text:>12} "
              f"{theirs / ours:>12.1f}x")
    if "cold_fork_1_s" not in figures:
        print("fork launcher: skipped (pip install accelerate to measure its notebook_launcher)")
    biggest = sizes[-1]
    for side in ("labkit", "spawn"):
        ratio = figures[f"cold_{side}_{biggest}_s"] / figures[f"cold_{side}_1_s"]
        figures[f"cold_{biggest}_over_1_{side}"] = round(ratio, 2)
    warm = labkit_warm(4, runs=50 if args.quick else 200)
    figures["warm_noop_labkit_4_ms"] = round(warm * 1e3, 3)
    figures["warm_spawn_over_labkit_4"] = round(figures["cold_spawn_4_s"] / warm, 1)
    scaling = [figures[f"cold_{biggest}_over_1_{side}"] for side in ("labkit", "spawn")]
    print(f"cold start, {biggest} ranks / 1 rank: labkit {scaling[0]}x, spawn {scaling[1]}x")
    print(f"warm no-op run on 4 ranks: labkit {warm * 1e3:.2f} ms; spawn has no warm path, "
          f"starting again costs {figures['cold_spawn_4_s']:.2f} s "
          f"({figures['warm_spawn_over_labkit_4']}x)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
