"""Benchmark: how far the planner's projections are from measured step times on this machine,
how long a search of a 70B decoder on 1024 GPUs takes, and its projections of published runs.

    python bench/plan.py          # 16 steps per run (the last 7 compared)
    python bench/plan.py --quick  # 10 steps per run (the last 4 compared), about a minute

1. Search: ``labkit.plan.search`` of GPT_70B on 128 nodes x 8 H100 (1024 GPUs), global batch
   1024, from cold caches (counting the model included); the best layout.
2. Calibration and error: at 1, 2 and 4 CPU ranks, ``labkit.plan.calibrate`` measures this
   machine (matmul FLOP/s, the bandwidth-bound ops' bytes/s, per-op cost, gloo collectives'
   alpha-beta, what meeting in collectives adds to compute at 2 ranks); then
   each classroom run of ``labkit.lessons.planning.checkrun.RUNS`` (DDP, FSDP, TP, 1F1B, composed)
   is projected and trained; the relative error of the projected step against the measured
   median steady step (the later half of the steps: a CPU rank's steps keep getting faster
   for about five steps), per run, median and worst. At 2 and 4 ranks the calibration also measures
   what tp's DTensors and FSDP2's hooks add per parameter tensor (``labkit.plan.engines``: a
   tiny decoder, not the runs compared). The load (run-queue delay over the timed steps) is
   applied per step's slowest rank; the errors under the other rules are printed too.
3. Published runs, projected: Megatron-LM's GPT 175B on 1536 A100s and Llama 3 405B on 16384
   H100s, their TFLOP/s per GPU beside the reported ones.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import labkit  # noqa: E402
import labkit.plan as plan  # noqa: E402
from labkit.lessons.planning.checkrun import compare, error_stats  # noqa: E402
from labkit.models import GPT_70B, GPTConfig  # noqa: E402
from labkit.plan.parallelism import Parallelism  # noqa: E402

PUBLISHED = {
    # name: (model, layout, cluster, batch, micro-batches, reported TFLOP/s per GPU, note)
    "megatron_gpt3_175b": (
        GPTConfig(vocab_size=51200, seq_len=2048, d_model=12288, n_heads=96, n_layers=96),
        Parallelism.of(dp=12, tp=8, pp=16, schedule="1f1b"), plan.Cluster("A100-80GB", nodes=192),
        1536, 128, 153.0, "Narayanan et al. 2021, Table 1 (counts recomputation)"),
    "llama3_405b": (
        GPTConfig(vocab_size=128000, seq_len=8192, d_model=16384, n_heads=128, n_layers=126),
        Parallelism.of(fsdp=128, tp=8, pp=16, schedule="1f1b"), plan.Cluster("H100", nodes=2048),
        2048, 16, 400.0, "Dubey et al. 2024, Table 4"),
}


def _search() -> dict:
    start = time.perf_counter()
    result = plan.search(GPT_70B, plan.Cluster("H100", gpus_per_node=8, nodes=128),
                         global_batch=1024)
    seconds = time.perf_counter() - start
    best = result.best
    print(f"search: 70B on 1024 H100s in {seconds:.2f} s: {len(result.fits)} fit, "
          f"{len(result.rejected)} refused; best {best.layout} m={best.lever.micro_batches} "
          f"{best.lever.precision} -> {best.step_s:.2f} s/step, MFU {best.mfu:.0%} (projected)")
    return {"search_70b_1024_s": seconds, "search_fits": len(result.fits),
            "search_best": str(best.layout)}


def _published() -> dict:
    out = {}
    for name, (model, layout, cluster, batch, micro, reported, source) in PUBLISHED.items():
        p = plan.project(model, layout, cluster, global_batch=batch, micro_batches=micro,
                         precision="mixed", activation_checkpointing=True)
        hardware = (p.costs.flops * layout.size) / p.step_s / layout.size / 1e12
        print(f"{name}: fits={p.fits} peak {p.peak_bytes / 1e9:.0f} GB; projected "
              f"{hardware:.0f} TFLOP/s per GPU (recomputation counted) vs reported "
              f"{reported:.0f} ({source})")
        out[name] = {"fits": p.fits, "projected_tflops": hardware, "reported_tflops": reported}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    figures = _search()
    with labkit.Cluster(4, device="cpu", max_world_size=4, progress=False) as cluster:
        comparisons, calibrations = compare(cluster, steps=10 if args.quick else 16,
                                            quick=args.quick)
    for n, c in calibrations.items():
        print(f"calibration at {n} ranks: matmul {c.matmul_flops / 1e9:.1f} GFLOP/s, "
              f"bandwidth-bound ops {c.memory_bandwidth / 1e9:.1f} GB/s, "
              f"{c.op_overhead_s * 1e6:.0f} us per op, sync jitter {c.sync_jitter:.2f}"
              + "".join(f"; {e} adds {t * 1e6:.0f} us per parameter tensor (+{b * 1e9:.1f} "
                        f"ns per weight byte, left to the bandwidth terms)"
                        for e, (t, b) in c.engine_overhead.items())
              + "".join(f"; {link}" for link in c.links.values()))
    print(f"{'run':<16}{'ranks':>6}{'alone ms':>10}{'load x':>8}{'projected ms':>14}"
          f"{'measured ms':>13}{'error':>8}")
    for c in comparisons:
        print(f"{c.name:<16}{c.world_size:>6}{c.predicted_alone_s * 1e3:>10.1f}"
              f"{c.load_factor:>8.2f}{c.predicted_s * 1e3:>14.1f}"
              f"{c.measured_s * 1e3:>13.1f}{c.error:>+8.0%}   stretch per rank "
              + " ".join(f"{x:.2f}" for x in c.rank_stretch)
              + "; load by rule " + " ".join(f"{r} {v:.2f}" for r, v in c.load_by_rule.items()))
    stats = error_stats(comparisons)
    print(f"median |error| {stats['median_abs_error']:.0%}, worst {stats['worst_abs_error']:.0%}"
          f" (this machine is shared: other processes change step times between runs)")
    for rule, (median, worst) in stats["by_rule"].items():
        print(f"  load applied by rule {rule!r}: median |error| {median:.0%}, worst {worst:.0%}")
    figures.update(stats)
    figures["calibrations"] = {n: c.to_dict() for n, c in calibrations.items()}
    figures["runs"] = [{"name": c.name, "ranks": c.world_size, "projected_s": c.predicted_s,
                        "projected_alone_s": c.predicted_alone_s, "load_factor": c.load_factor,
                        "load_by_rule": c.load_by_rule, "rank_stretch": c.rank_stretch,
                        "measured_s": c.measured_s} for c in comparisons]
    figures["published"] = _published()
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
