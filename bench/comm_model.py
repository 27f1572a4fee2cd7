"""Benchmark: how well the alpha-beta model predicts collectives at sizes it was not fitted on.

    python bench/comm_model.py          # sizes 1 KiB to 64 MiB, 50 repeats each
    python bench/comm_model.py --quick  # about 20 seconds

On one 2-rank cluster (CPU ranks: gloo over loopback; GPUs: NCCL), every collective labkit
teaches (``labkit.comm.KINDS``) is timed at each size (``time_collectives``: the slowest
rank's fastest repeat). Each collective's model t = alpha + wire bytes / beta is fitted
(``CollectiveSweep.fit``) on every other size, the smallest and the largest included, and then
predicts the sizes in between, which it never saw. Reported per collective: alpha, beta, and
the relative error |predicted - measured| / measured at each held-out size (the issue's target:
within 25%). Times on a shared machine are noisy; this is a measurement, not a test.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import os

import labkit
from labkit.comm import KINDS, time_collectives

KIB = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about 20 seconds")
    parser.add_argument("--ranks", type=int, default=2)
    args = parser.parse_args()
    # sizes x4 apart; fitted on the even positions (ends included), held out on the odd ones
    sizes = [4 ** k * KIB for k in range(1, 7)] if args.quick else [4 ** k * KIB
                                                                      for k in range(0, 9)]
    fitted = sizes[::2] + ([sizes[-1]] if len(sizes) % 2 == 0 else [])
    held_out = [s for s in sizes if s not in fitted]
    repeats = 25 if args.quick else 50
    figures = {"cores": os.cpu_count(), "quick": args.quick, "ranks": args.ranks,
               "sizes_bytes": sizes, "fitted_bytes": fitted, "held_out_bytes": held_out,
               "repeats": repeats, "kinds": {}}
    with labkit.Cluster(args.ranks, progress=False) as cluster:
        figures["device"] = cluster.device
        sweep = time_collectives(cluster, KINDS, sizes, repeats=repeats)
    worst = 0.0
    for kind in KINDS:
        timings = sweep.timings[kind]
        measured = dict(zip(timings.sizes_bytes, timings.seconds, strict=True))
        model = sweep.fit(kind, fitted)
        errors = model.relative_errors(held_out, [measured[s] for s in held_out])
        worst = max(worst, *errors)
        figures["kinds"][kind] = {
            "alpha_us": round(model.alpha_s * 1e6, 2), "bandwidth_GBps": round(
                model.bandwidth / 1e9, 4), "held_out_errors": [round(e, 4) for e in errors],
            "seconds": {str(s): round(t, 7) for s, t in measured.items()}}
        print(f"{kind:15s} {model}; held-out errors "
              + ", ".join(f"{s // KIB} KiB {e:.0%}" for s, e in zip(held_out, errors,
                                                                   strict=True)), flush=True)
    figures["worst_held_out_error"] = round(worst, 4)
    figures["within_25_percent"] = worst <= 0.25
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
