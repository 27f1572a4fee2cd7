"""Benchmark: labkit's projections of published large-scale trainings against the figures
their authors published (``bench/published_runs.py`` lists the runs, their sources and
every assumption of the rebuild).

    python bench/published.py          # every run
    python bench/published.py --quick  # the same runs (counting is cached): about a minute

Prints per run the published figure, the projection in the same unit, the error
(projected / published - 1) and whether the layout fits; then the median and the worst
|error|. The last line is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from published_runs import (  # noqa: E402
    COUNTED_TFLOPS,
    MEGATRON_TFLOPS,
    RUNS,
    SECONDS,
    TOKENS,
    Run,
    megatron_flops,
)

import labkit.plan as plan  # noqa: E402


def in_unit(run: Run, projection) -> float:
    """The projected step in the published figure's unit."""
    step, gpus = projection.step_s, run.layout.size
    if run.unit == SECONDS:
        return step
    if run.unit == TOKENS:
        return run.global_batch * run.model.seq_len / step / gpus
    if run.unit == MEGATRON_TFLOPS:
        return megatron_flops(run.model, run.global_batch) / step / gpus / 1e12
    if run.unit == COUNTED_TFLOPS:
        return projection.costs.model_flops / step / gpus / 1e12
    raise ValueError(f"unknown unit {run.unit!r}")


def error(run: Run, projected: float) -> float:
    """Projected over published, less 1, as a throughput: a time (s per iteration) is
    inverted, so that -10% always means 'projected 10% slower than published'."""
    if run.unit == SECONDS:
        return run.published / projected - 1
    return projected / run.published - 1


def project(run: Run):
    cluster = plan.Cluster(run.gpu, nodes=run.layout.size // 8, **run.cluster)
    return plan.project(run.model, run.layout, cluster, global_batch=run.global_batch,
                        micro_batches=run.micro_batches, precision="mixed", **run.levers)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same runs (kept for CI)")
    parser.parse_args()
    start = time.perf_counter()
    rows = []
    print(f"{'run':<28}{'published':>11}{'projected':>11}{'error':>8}  fits  unit")
    for run in RUNS:
        p = project(run)
        projected = in_unit(run, p)
        rows.append({"name": run.name, "unit": run.unit, "published": run.published,
                     "projected": projected, "error": error(run, projected), "fits": p.fits,
                     "peak_gb": p.peak_bytes / 1e9, "split": p.split()})
        r = rows[-1]
        print(f"{run.name:<28}{run.published:>11.2f}{projected:>11.2f}{r['error']:>+8.1%}  "
              f"{'yes' if p.fits else 'NO ':<4}  {run.unit}")
    errors = [abs(r["error"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["error"]))
    misfits = [r["name"] for r in rows if not r["fits"]]
    print(f"{len(rows)} runs: median |error| {statistics.median(errors):.1%}, worst "
          f"{abs(worst['error']):.1%} ({worst['name']}); {len(misfits)} said not to fit"
          + (f": {', '.join(misfits)}" if misfits else "")
          + f"; {time.perf_counter() - start:.0f} s")
    print(json.dumps({"median_abs_error": statistics.median(errors),
                      "worst_abs_error": abs(worst["error"]), "worst_run": worst["name"],
                      "not_fitting": misfits, "runs": rows}))


if __name__ == "__main__":
    main()
