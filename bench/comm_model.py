"""Benchmark: how well the alpha-beta model predicts collectives at sizes it was not fitted on.

    python bench/comm_model.py          # sizes 1 KiB to 16 MiB, 2x apart, 100 rounds
    python bench/comm_model.py --quick  # 1 KiB to 1 MiB only, about 15 seconds under load

On one 2-rank cluster (CPU ranks: gloo over loopback; GPUs: NCCL), every collective labkit
teaches (``labkit.runtime.comm.KINDS``) is timed at each size in interleaved rounds
(``time_collectives``: per size, a low quantile of the rounds, each from the last rank's start
to the last rank's end). For each range of sizes, each collective's model t = alpha + wire
bytes / beta is fitted (``CollectiveSweep.fit``, least relative error) on every other size,
both ends included, and then predicts the sizes in between, which it never saw. Reported per
range and collective: alpha, beta, and the relative error |predicted - measured| / measured
at each held-out size (the target: within 25%; ``tests/test_comm_model.py`` asserts
it for 1 KiB to 1 MiB). The full run adds sizes past the CPU caches (to 16 MiB), where the
time per byte bends upwards and one straight line over the whole range fits worse.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os

import labkit
from labkit.runtime.comm import KINDS, time_collectives

KIB = 1024


def held_out_errors(sweep, kind: str, sizes: list[int]) -> tuple[object, list[float]]:
    """Fit ``kind`` on sizes[0::2] (the last size too), return the model and its relative
    errors at the others."""
    fitted = sizes[::2] + ([sizes[-1]] if len(sizes) % 2 == 0 else [])
    held_out = [s for s in sizes if s not in fitted]
    timings = sweep.timings[kind]
    measured = dict(zip(timings.sizes_bytes, timings.seconds, strict=True))
    model = sweep.fit(kind, fitted)
    return model, model.relative_errors(held_out, [measured[s] for s in held_out])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="1 KiB to 1 MiB only, about 15 seconds under load")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100)
    args = parser.parse_args()
    sizes = [KIB << k for k in range(11 if args.quick else 15)]
    ranges = {"1KiB-1MiB": [s for s in sizes if s <= 1024 * KIB]}
    if not args.quick:
        ranges["1KiB-16MiB"] = sizes
    figures = {"cores": os.cpu_count(), "quick": args.quick, "ranks": args.ranks,
               "sizes_bytes": sizes, "rounds": args.rounds,
               "load_before": os.getloadavg()[0], "ranges": {}}
    with labkit.Cluster(args.ranks, progress=False) as cluster:
        figures["device"] = cluster.device
        sweep = time_collectives(cluster, KINDS, sizes, repeats=args.rounds)
    figures["seconds"] = {k: [round(t, 7) for t in sweep.timings[k].seconds] for k in KINDS}
    for name, span in ranges.items():
        worst, rows = 0.0, {}
        for kind in KINDS:
            model, errors = held_out_errors(sweep, kind, span)
            worst = max(worst, *errors)
            rows[kind] = {"alpha_us": round(model.alpha_s * 1e6, 2),
                          "bandwidth_GBps": round(model.bandwidth / 1e9, 4),
                          "held_out_errors": [round(e, 4) for e in errors]}
            print(f"{name:11s} {kind:15s} {model}; held-out errors "
                  + " ".join(f"{e:.0%}" for e in errors), flush=True)
        figures["ranges"][name] = {"kinds": rows, "worst_held_out_error": round(worst, 4),
                                   "within_25_percent": worst <= 0.25}
    figures["load_after"] = os.getloadavg()[0]
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
