"""Benchmark: what labkit's memory tracking costs, and how close the estimate comes.

    python bench/memory.py          # 3 zoo models, 30 timed steps each
    python bench/memory.py --quick  # about a minute

1. Overhead: the same training step (one thread, as a virtual GPU) with and without the
   MemoryTracker, alternating step by step (and which goes first) so that both see the same
   machine and the same allocator state; each step is timed by the CPU time this process
   used, which other processes on a shared machine do not inflate (wall time is printed
   too). The ratio of medians is printed per model (target: under 1.3x).
2. Estimate vs measured: each zoo model trained for a few steps on a 1-rank cluster; the
   traced estimate beside the measured peak.
3. Against the CPU allocator: two Adam steps of torch.nn models that are not from the zoo,
   on a capped rank, the tracked peak beside the allocator's own (torch.profiler's memory
   events, labkit/runtime/memory/crosscheck.py, as tests/test_memory_coverage.py).
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import labkit
from labkit.models import DLRMConfig, GPTConfig, MLPConfig, build_model, loss_fn, make_batch
from labkit.models.optim import make_optimizer
from labkit.runtime.memory import MemoryTracker
from labkit.training.step import run_step

MODELS = {"mlp": (MLPConfig(d_in=256, d_hidden=1024, n_layers=4), 256),
          "gpt": (GPTConfig(d_model=256, n_layers=4, seq_len=128), 16),
          "dlrm": (DLRMConfig(num_tables=8, rows_per_table=20000, embedding_dim=32), 512)}


def _step(model, batch, config, optimizer, tracker) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one training step, under ``tracker`` if given."""
    cpu, wall = time.process_time(), time.perf_counter()
    if tracker is None:
        run_step(model, batch, loss_fn(config), optimizer, "fp32")
    else:
        with tracker:
            run_step(model, batch, loss_fn(config), optimizer, "fp32")
    return time.process_time() - cpu, time.perf_counter() - wall


def overhead(config, batch_size: int, steps: int) -> dict:
    torch.set_num_threads(1)
    model = build_model(config)
    optimizer = make_optimizer("adam", model.parameters(), 1e-3)
    batch = make_batch(config, 0, batch_size)
    tracker = MemoryTracker()
    tracker.track_external(model, optimizer)
    times: dict = {None: [], tracker: []}
    for step in range(steps + 2):
        order = (None, tracker) if step % 2 else (tracker, None)  # neither always goes first
        for context in order:
            measured = _step(model, batch, config, optimizer, context)
            if step >= 2:  # the first steps create optimizer state
                times[context].append(measured)
    plain = [statistics.median(t[i] for t in times[None]) for i in (0, 1)]
    tracked = [statistics.median(t[i] for t in times[tracker]) for i in (0, 1)]
    return {"plain_ms": plain[0] * 1e3, "tracked_ms": tracked[0] * 1e3,
            "ratio": tracked[0] / plain[0], "wall_ratio": tracked[1] / plain[1]}


def allocator_cross_check() -> dict:
    """Tracked peak / allocator peak for torch.nn models outside the zoo, on a capped rank."""
    from labkit.runtime.memory.crosscheck import cross_check

    with labkit.Cluster(1, device="cpu", memory_per_device="1GiB", progress=False) as cluster:
        return {name: cluster.run(cross_check, name)[0]
                for name in ("transformer", "cnn", "lstm", "gru")}


def estimate_vs_measured(cluster, config, batch_size: int) -> dict:
    report = labkit.train(cluster, model=config, global_batch=batch_size, steps=3)
    return {"measured_bytes": report.peak_bytes[0],
            "estimated_bytes": report.estimate["peak_bytes"],
            "error": report.estimate_error(),
            "phase": report.ranks[0]["memory"]["peak_phase"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute")
    args = parser.parse_args()
    steps = 10 if args.quick else 30
    figures: dict = {"steps": steps}
    print(f"{'model':6} {'plain ms':>9} {'tracked ms':>11} {'ratio':>6} {'(wall)':>7}  CPU time")
    for name, (config, batch) in MODELS.items():
        row = overhead(config, batch, steps)
        figures[f"overhead_{name}"] = round(row["ratio"], 3)
        figures[f"overhead_wall_{name}"] = round(row["wall_ratio"], 3)
        print(f"{name:6} {row['plain_ms']:9.1f} {row['tracked_ms']:11.1f} {row['ratio']:6.2f}x "
              f"{row['wall_ratio']:6.2f}x")
    print(f"\n{'model':6} {'measured':>12} {'estimated':>12} {'error':>8}  peak during")
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        for name, (config, batch) in MODELS.items():
            row = estimate_vs_measured(cluster, config, batch)
            figures[f"estimate_error_{name}"] = round(row["error"], 6)
            print(f"{name:6} {labkit.format_bytes(row['measured_bytes']):>12} "
                  f"{labkit.format_bytes(row['estimated_bytes']):>12} "
                  f"{100 * row['error']:7.3f}%  {row['phase']}")
    print(f"\n{'torch.nn':12} {'tracked':>10} {'allocator':>10} {'ratio':>8}")
    for name, (tracked, allocator) in allocator_cross_check().items():
        figures[f"tracked_over_allocator_{name}"] = round(tracked / allocator, 4)
        print(f"{name:12} {labkit.format_bytes(tracked):>10} {labkit.format_bytes(allocator):>10}"
              f" {tracked / allocator:8.4f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
