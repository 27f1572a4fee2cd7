"""Benchmark: labkit's projections of published large-scale trainings against the figures
their authors published (``labkit.plan.published`` lists the runs, their sources and
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

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from labkit.plan.published import RUNS, compare  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the same runs (kept for CI)")
    parser.parse_args()
    start = time.perf_counter()
    print(f"{'run':<28}{'published':>11}{'projected':>11}{'error':>8}  fits  unit")
    rows = []
    for r in RUNS:
        rows += compare([r.name])
        row = rows[-1]
        print(f"{r.name:<28}{r.published:>11.2f}{row['projected']:>11.2f}{row['error']:>+8.1%}"
              f"  {'yes' if row['fits'] else 'NO ':<4}  {r.unit}")
    errors = [abs(r["error"]) for r in rows]
    worst = max(rows, key=lambda r: abs(r["error"]))
    misfits = [r["run"] for r in rows if not r["fits"]]
    print(f"{len(rows)} runs: median |error| {statistics.median(errors):.1%}, worst "
          f"{abs(worst['error']):.1%} ({worst['run']}); {len(misfits)} said not to fit"
          + (f": {', '.join(misfits)}" if misfits else "")
          + f"; {time.perf_counter() - start:.0f} s")
    print(json.dumps({"median_abs_error": statistics.median(errors),
                      "worst_abs_error": abs(worst["error"]), "worst_run": worst["run"],
                      "not_fitting": misfits, "runs": rows}))


if __name__ == "__main__":
    main()
