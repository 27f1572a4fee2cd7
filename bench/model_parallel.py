"""Benchmark: pipeline bubbles measured against (p-1)/(m+p-1), and labkit's pipeline step
against a plain torch.distributed.pipelining loop on the same ranks.

    python bench/model_parallel.py          # m = 1, 2, 4, 8 on 2 stages, 3 rounds
    python bench/model_parallel.py --quick  # about a minute

All on 2 CPU ranks (one core each) with a compute-dominated MLP; runs interleaved in one
invocation. Interleaved 1F1B (two stages per rank, 8 layers) is measured beside 1F1B on the
same model at m = 4 and 8. The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

import labkit
from labkit.models import MLPConfig, build_model, loss_fn, make_batch, plan_for
from labkit.parallel.pipeline.stages import split_stages, stage_module
from labkit.parallel.pipeline.timeline import bubble_fraction, theoretical_bubble

MODEL = MLPConfig(d_in=512, d_hidden=1024, n_layers=4)
BATCH = 1024


def _plain_gpipe(ctx, micro_batches: int, steps: int) -> list[float]:
    """The pipeline as one would write it with torch.distributed.pipelining alone."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    layers = plan_for(MODEL).layers(build_model(MODEL))
    stage = stage_module(split_stages(layers, ctx.world_size)[ctx.rank])[0]
    schedule = ScheduleGPipe(PipelineStage(stage, ctx.rank, ctx.world_size, ctx.device),
                             micro_batches, loss_fn=loss_fn(MODEL))
    optimizer = torch.optim.SGD(stage.parameters(), lr=1e-3)
    last = ctx.rank == ctx.world_size - 1
    times = []
    for step in range(steps):
        inputs, targets = make_batch(MODEL, step, BATCH)
        start = time.perf_counter()
        if ctx.rank == 0:
            schedule.step(inputs)
        elif last:
            schedule.step(target=targets, losses=[])
        else:
            schedule.step()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def _interleaved(steps: int) -> dict:
    """1F1B vs interleaved 1F1B (v = 2 stages per rank) on an 8-layer MLP: bubble measured
    and by formula, and step time."""
    config = labkit.TrainConfig(model=MLPConfig(d_in=512, d_hidden=1024, n_layers=8),
                                global_batch=2 * BATCH, steps=steps, optimizer="sgd")
    out = {}
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        for m in (4, 8):
            for schedule, virtual in (("1f1b", 1), ("interleaved_1f1b", 2)):
                report = labkit.train(cluster, config, strategy=schedule, micro_batches=m)
                out[f"{schedule}_m{m}_bubble"] = round(statistics.median(
                    bubble_fraction([r["records"][s]["timeline"] for r in report.ranks])
                    for s in range(1, steps)), 3)
                out[f"{schedule}_m{m}_theory"] = round(theoretical_bubble(2, m, virtual), 3)
                out[f"{schedule}_m{m}_step_ms"] = round(report.median_step_s * 1e3, 1)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute")
    args = parser.parse_args()
    steps, rounds = (4, 1) if args.quick else (6, 3)
    config = labkit.TrainConfig(model=MODEL, global_batch=BATCH, steps=steps, optimizer="sgd")
    bubbles: dict[int, list[float]] = {m: [] for m in (1, 2, 4, 8)}
    ours, plain = [], []
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        for _ in range(rounds):
            for m in bubbles:
                schedule = "naive_pipeline" if m == 1 else "gpipe"
                report = labkit.train(cluster, config, strategy=schedule, micro_batches=m)
                bubbles[m].append(statistics.median(
                    bubble_fraction([r["records"][s]["timeline"] for r in report.ranks])
                    for s in range(1, steps)))
                if m == 4:
                    ours.append(report.median_step_s)
                    per_rank = cluster.run(_plain_gpipe, 4, steps)
                    plain.append(statistics.median(  # the first step infers shapes
                        max(t) for t in zip(*[r[1:] for r in per_rank], strict=True)))
    figures = {"steps": steps, "rounds": rounds, "stages": 2}
    print(f"{'m':>3} {'measured bubble':>16} {'(p-1)/(m+p-1)':>14}")
    for m, values in bubbles.items():
        measured, theory = statistics.median(values), theoretical_bubble(2, m)
        figures[f"bubble_m{m}"] = round(measured, 3)
        figures[f"theory_m{m}"] = round(theory, 3)
        print(f"{m:>3} {measured:16.3f} {theory:14.3f}")
    interleaved = _interleaved(steps)
    figures.update(interleaved)
    for key, value in interleaved.items():
        print(f"{key}: {value}")
    ratio = statistics.median(ours) / statistics.median(plain)
    figures["labkit_over_plain_gpipe"] = round(ratio, 3)
    print(f"labkit GPipe step / plain torch.distributed.pipelining step (m=4): {ratio:.3f} "
          "(target <= 1.05)")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
