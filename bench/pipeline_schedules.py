"""Benchmark: the hand-written pipeline schedules' bubble against torch's, on the same ranks.

    python bench/pipeline_schedules.py          # m = 1, 4, 8 on 2 stages, 5 rounds
    python bench/pipeline_schedules.py --quick  # m = 1 and 4, 3 rounds: about a minute

Each pair trains the same run twice, labkit's hand-written schedule
(``labkit/parallel/pipeline/naive.py``) and torch.distributed.pipelining's
(``ScheduleGPipe``, ``Schedule1F1B``), timed by the same timeline (each stage's forward and
backward chunks). The runs of a round are interleaved, so that a busy moment of the machine
falls on both, and which of a pair runs first alternates from round to round, so that
neither is always the one that runs after a switch of schedule or as the load drifts. Per
run the bubble is ``measured_bubble`` (the median over the steps after the first); per
schedule, the median over rounds and the spread (largest minus smallest); per pair, the gap
(hand-written minus torch's) round by round, its median and its range, which say how far
apart the two are against the noise. All on 2 CPU ranks (one core each) with a
compute-dominated MLP. The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics

import labkit
from labkit.models import MLPConfig
from labkit.parallel.pipeline.timeline import measured_bubble, theoretical_bubble
from labkit.training.layout import Layout

MODEL = MLPConfig(d_in=512, d_hidden=1024, n_layers=4)
BATCH = 1024
# (micro-batches, hand-written schedule, torch's schedule that runs the same order)
PAIRS = [(1, "naive", "gpipe"), (4, "naive_gpipe", "gpipe"), (4, "naive_1f1b", "1f1b"),
         (8, "naive_gpipe", "gpipe"), (8, "naive_1f1b", "1f1b")]


def _rounds(cluster, pairs, rounds: int, steps: int) -> dict[tuple, dict[str, list]]:
    """Per (m, hand, torch) and per schedule: each round's bubble and median step time."""
    config = labkit.TrainConfig(model=MODEL, global_batch=BATCH, steps=steps,
                                optimizer="sgd", layout=Layout(pp=cluster.world_size))
    runs = {pair: {name: {"bubble": [], "step_s": []} for name in pair[1:]} for pair in pairs}
    for round_index in range(rounds):
        for pair in pairs:
            m, *names = pair
            for name in names if round_index % 2 == 0 else names[::-1]:
                report = labkit.train(cluster, config, schedule=name, micro_batches=m,
                                      estimate=False)
                runs[pair][name]["bubble"].append(measured_bubble(report))
                runs[pair][name]["step_s"].append(report.median_step_s)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="m = 1 and 4, 3 rounds: about a minute")
    args = parser.parse_args()
    rounds, steps = (3, 5) if args.quick else (5, 6)
    pairs = [p for p in PAIRS if p[0] <= 4] if args.quick else PAIRS
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        runs = _rounds(cluster, pairs, rounds, steps)
    figures: dict = {"rounds": rounds, "steps": steps, "stages": 2}
    print(f"{'m':>2} {'schedule':>11} {'bubble':>7} {'spread':>7} {'formula':>8} "
          f"{'step ms':>8}")
    for (m, hand, torch_name), by_name in runs.items():
        key = f"m{m}_{torch_name}"
        for name, values in by_name.items():
            bubble = statistics.median(values["bubble"])
            spread = max(values["bubble"]) - min(values["bubble"])
            step_ms = statistics.median(values["step_s"]) * 1e3
            who = "hand" if name == hand else "torch"
            figures[f"{key}_{who}_bubble"] = round(bubble, 3)
            figures[f"{key}_{who}_spread"] = round(spread, 3)
            figures[f"{key}_{who}_step_ms"] = round(step_ms, 1)
            print(f"{m:>2} {name:>11} {bubble:7.3f} {spread:7.3f} "
                  f"{theoretical_bubble(2, m):8.3f} {step_ms:8.1f}")
        gaps = [a - b for a, b in zip(by_name[hand]["bubble"], by_name[torch_name]["bubble"],
                                      strict=True)]  # round by round: the same moment
        gap = statistics.median(gaps)
        figures[f"{key}_gap"] = round(gap, 3)
        figures[f"{key}_gap_range"] = [round(min(gaps), 3), round(max(gaps), 3)]
        figures[f"{key}_theory"] = round(theoretical_bubble(2, m), 3)
        print(f"   {hand} - {torch_name}: {gap:+.3f} (rounds: {min(gaps):+.3f} to "
              f"{max(gaps):+.3f})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
