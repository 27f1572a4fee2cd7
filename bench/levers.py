"""Benchmark: what each memory lever of one device saves, and what it costs in step time.

    python bench/levers.py          # a wider GPT, 12 timed steps per lever
    python bench/levers.py --quick  # about a minute

One GPT on a 1-rank cluster (one core: a virtual GPU), plain and with each lever
(``TrainConfig`` fields): activation checkpointing, gradient accumulation over 4 micro-steps,
bf16 and mixed precision, and checkpointing + accumulation + mixed together.

1. Memory: each configuration trained by ``labkit.train`` (two tracked steps); the tracked
   peak (deterministic) beside the traced estimate (``labkit.estimate_memory``), and each
   category's own peak.
2. Step time: every configuration built on the same rank by labkit's build path; then step
   by step, the configurations take turns (the order rotating each round), each step timed
   by the CPU time of the rank's process, which other processes on a shared machine do not
   inflate. Reported: the median step of each, and its ratio to the plain run's.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import labkit
from labkit.models import GPTConfig, count_parameters
from labkit.training.run import resolve

LEVERS = {"plain": {},
          "checkpointing": {"activation_checkpointing": True},
          "accumulation x4": {"grad_accumulation": 4},
          "bf16": {"precision": "bf16"},
          "mixed": {"precision": "mixed"},
          "all (ckpt + acc x4 + mixed)": {"activation_checkpointing": True,
                                          "grad_accumulation": 4, "precision": "mixed"}}


def _mib(n: int) -> float:
    return round(n / 2**20, 2)


def _memory(report) -> dict:
    measured = report.ranks[0]["memory"]
    return {"peak_mib": _mib(report.peak_bytes[0]),
            "estimate_mib": _mib(report.estimate["peak_bytes"]),
            "estimate_error": round(report.estimate_error(), 4),
            "category_peaks_mib": {c: _mib(v) for c, v in measured["category_peaks"].items()}}


def _time_on_rank(ctx, configs: dict, steps: int) -> dict[str, list[float]]:
    """CPU seconds of each of ``steps`` training steps per configuration, taking turns."""
    from labkit.models import loss_fn, make_batch, to_device
    from labkit.training.build import build, parallel_context
    from labkit.training.run import Run
    from labkit.training.step.spmd import micro_steps, run_step, step_precision

    runs = {name: Run.from_dict(r) for name, r in configs.items()}
    configs = {name: run.config for name, run in runs.items()}
    built = {name: build(parallel_context(ctx, run)) for name, run in runs.items()}
    names, times = list(configs), {name: [] for name in configs}
    for step in range(steps + 1):  # step 0 makes the optimizer state: left out
        for name in names[step % len(names):] + names[:step % len(names)]:
            config, parts = configs[name], built[name]
            batch = to_device(make_batch(config.model, step, config.global_batch, config.seed),
                              ctx.device, copy=True)
            start = time.process_time()
            run_step(parts.model, batch, loss_fn(config.model), parts.optimizer,
                     step_precision(config, parts), micro_batches=micro_steps(config),
                     no_sync=parts.no_sync)
            if step:
                times[name].append(time.process_time() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute")
    args = parser.parse_args()
    model = GPTConfig(d_model=128 if args.quick else 256, n_layers=4, seq_len=128)
    batch, steps = 16, 5 if args.quick else 12
    figures = {"cores": os.cpu_count(), "quick": args.quick, "model": str(model),
               "parameters": count_parameters(model), "global_batch": batch,
               "timed_steps": steps, "levers": {}}
    configs = {name: labkit.TrainConfig(model=model, global_batch=batch, steps=2,
                                        optimizer="adam", **fields)
               for name, fields in LEVERS.items()}
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        for name, config in configs.items():
            report = labkit.train(cluster, config)
            figures["levers"][name] = {**_memory(report), "losses": report.losses}
            print(f"{name}: measured and estimated", flush=True)
        times = cluster.run(_time_on_rank, {n: resolve(c, 1).to_dict()
                                            for n, c in configs.items()}, steps)[0]
    plain_mib = figures["levers"]["plain"]["peak_mib"]
    plain_s = statistics.median(times["plain"])
    for name, entry in figures["levers"].items():
        median = statistics.median(times[name])
        entry.update(saved_fraction=round(1 - entry["peak_mib"] / plain_mib, 4),
                     step_cpu_s=round(median, 4), step_time_ratio=round(median / plain_s, 3))
        print(f"{name:28s} peak {entry['peak_mib']:7.2f} MiB (estimate "
              f"{entry['estimate_mib']:7.2f}), saves {100 * entry['saved_fraction']:5.1f}%; "
              f"step {1e3 * median:6.1f} ms CPU, x{entry['step_time_ratio']:.2f}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
