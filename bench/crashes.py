"""Benchmark (the reliability bar): 30 planted crashes of random kinds at random steps over
one long checkpointed run; every one resumed, no step lost beyond the last checkpoint, no
orphan process, final weights equal to the uninterrupted run's.

    python bench/crashes.py          # a wider MLP, 4 ranks where the machine has the cores
    python bench/crashes.py --quick  # about a minute or two

Each crash is one attempt of the run (``labkit.lessons.checkpoints.failures.fail_once``): it resumes
from the newest checkpoint, and a random rank fails at a random later step, a random way:
SIGKILLed, an exception, or hung until the run's timeout. After each, the newest checkpoint
on disk must be the last one due before the failure. Then the run is trained to its end and
compared with an uninterrupted run: losses and every rank's final weights, bit for bit.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
import time
import warnings
from pathlib import Path

import psutil
import torch

import labkit
from labkit.lessons.checkpoints.failures import fail_once
from labkit.models import MLPConfig

KINDS, WEIGHTS = ("kill", "raise", "hang"), (0.45, 0.45, 0.10)  # a hang costs its timeout


def _newest(folder: str) -> int:
    steps = [int(m.group(1)) for p in Path(folder).iterdir()
             if (m := re.fullmatch(r"step-(\d+)", p.name))]
    return max(steps, default=0)


def _same_weights(a, b) -> bool:
    return all(torch.equal(ra["weights"][k], rb["weights"][k])
               for ra, rb in zip(a.ranks, b.ranks, strict=True) for k in ra["weights"])


def _crashes(cluster, config, count: int, every: int, seed: int, hang_s: float) -> list[dict]:
    rng, resume, crashes = random.Random(seed), 0, []
    while len(crashes) < count and resume < config.steps - 1:
        at = rng.randint(resume + 1, min(config.steps - 1, resume + 2 * every))
        how = rng.choices(KINDS, WEIGHTS)[0]
        rank = rng.randrange(cluster.world_size)
        start = time.monotonic()
        error = fail_once(cluster, config, rank, at, how, hang_timeout=hang_s)
        newest = _newest(config.checkpoint_dir)
        due = max(resume, (at - 1) // every * every)  # the save at step `at` never happened
        crashes.append({"at": at, "how": how, "rank": rank, "resumed_from": resume,
                        "newest": newest, "ok": newest == due, "lost": at - newest,
                        "seconds": round(time.monotonic() - start, 2), "error": error[:120]})
        print(f"crash {len(crashes):2d}: rank {rank} {how:5s} after {at:3d} steps; newest "
              f"checkpoint {newest:3d} (due {due}); {crashes[-1]['seconds']} s", flush=True)
        resume = newest
    return crashes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a minute or two")
    parser.add_argument("--crashes", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    world = 2 if args.quick else 4
    every = 2
    model = MLPConfig(d_hidden=64 if args.quick else 256, n_layers=3)
    steps = 2 * every * args.crashes // 2 + 10
    base = labkit.TrainConfig(model=model, strategy="fsdp", global_batch=16, steps=steps,
                              return_weights=True)
    warnings.simplefilter("ignore", labkit.RanksRestartedWarning)
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as folder, labkit.Cluster(world, progress=False) as cluster:
        reference = labkit.train(cluster, base, estimate=False)
        config = base.replace(checkpoint_dir=folder, checkpoint_every=every)
        crashes = _crashes(cluster, config, args.crashes, every, args.seed,
                           hang_s=8.0 if args.quick else 20.0)
        final = labkit.train(cluster, config, estimate=False)
    time.sleep(0.5)
    orphans = [p.pid for p in psutil.Process().children(recursive=True)]
    figures = {"cores": os.cpu_count(), "quick": args.quick, "world_size": world,
               "steps": steps, "every": every, "crashes": len(crashes),
               "kinds": {k: sum(c["how"] == k for c in crashes) for k in KINDS},
               "all_resumed_from_the_last_due_checkpoint": all(c["ok"] for c in crashes),
               "max_lost_steps": max(c["lost"] for c in crashes),
               "losses_equal": final.losses == reference.losses,
               "weights_equal": _same_weights(final, reference),
               "orphans": orphans, "seconds": round(time.monotonic() - started, 1),
               "crash_log": crashes}
    print(f"{len(crashes)} crashes; every resume from the last due checkpoint: "
          f"{figures['all_resumed_from_the_last_due_checkpoint']}; at most "
          f"{figures['max_lost_steps']} steps lost (a save every {every}); losses equal: "
          f"{figures['losses_equal']}; weights equal: {figures['weights_equal']}; orphan "
          f"processes: {len(orphans)}; {figures['seconds']} s")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
