"""Benchmark: what a checkpoint costs per layout, blocking (``dcp.save``) against async
(``dcp.async_save``), and the Young/Daly interval that cost implies.

    python bench/checkpoint.py          # a wider GPT, 12 steps, a save every 2
    python bench/checkpoint.py --quick  # about a minute

For each layout on a 2-rank CPU cluster the same run is trained three times, side by side:
without checkpoints, saving every k steps with ``dcp.save`` and with ``dcp.async_save``
(``TrainConfig(checkpoint_async=True)``). Reported per layout: the bytes per rank of one
checkpoint, the median time training was held up by a save (blocking: the whole save; async:
the copy to host memory), the median time until an async save was written, the median step,
and the wall time of each run's steps (steps plus saves, from its records) against the run
without checkpoints. Then the Young/Daly interval (``labkit.lessons.checkpoints.interval``) for the
blocking save cost with a one-hour mean time between failures. The machine may be shared:
the figures are ratios measured in one run. The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile

import labkit
from labkit.lessons.checkpoints import interval
from labkit.models import GPTConfig, count_parameters

LAYOUTS = {"ddp": {"strategy": "ddp"}, "fsdp": {"strategy": "fsdp"}, "tp": {"strategy": "tp"}}
MTBF_S = 3600.0  # one failure an hour, for the interval figure


def _median(report, key: str) -> float:
    values = [r[key] for rank in report.ranks for r in rank["records"] if key in r]
    return statistics.median(values) if values else 0.0


def _steps_wall(report) -> float:
    """Rank 0's time in steps and saves (what the run spent, without building it)."""
    return sum(r["step_s"] + r.get("checkpoint_s", 0.0) for r in report.ranks[0]["records"])


def _layout(cluster, base: dict, every: int) -> dict:
    runs = {}
    with tempfile.TemporaryDirectory() as blocking, tempfile.TemporaryDirectory() as background:
        for name, extra in (("none", {}),
                            ("blocking", {"checkpoint_dir": blocking, "checkpoint_every": every}),
                            ("async", {"checkpoint_dir": background, "checkpoint_every": every,
                                       "checkpoint_async": True})):
            runs[name] = labkit.train(cluster, labkit.TrainConfig(**base, **extra),
                                      estimate=False)
    assert runs["blocking"].losses == runs["none"].losses == runs["async"].losses
    save_s = _median(runs["blocking"], "checkpoint_s")
    step_s = _median(runs["none"], "step_s")
    plain = _steps_wall(runs["none"])
    return {"bytes_per_rank": int(_median(runs["blocking"], "checkpoint_bytes")),
            "step_s": round(step_s, 4),
            "blocking_save_s": round(save_s, 4),
            "async_stall_s": round(_median(runs["async"], "checkpoint_s"), 4),
            "async_write_s": round(_median(runs["async"], "checkpoint_write_s"), 4),
            "async_stall_over_blocking": round(_median(runs["async"], "checkpoint_s")
                                               / save_s, 3),
            "wall_ratio_blocking": round(_steps_wall(runs["blocking"]) / plain, 3),
            "wall_ratio_async": round(_steps_wall(runs["async"]) / plain, 3),
            "young_daly_steps_at_1h_mtbf": interval.interval_steps(save_s, step_s, MTBF_S)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="about a minute")
    args = parser.parse_args()
    model = GPTConfig(d_model=128 if args.quick else 256, n_layers=4, seq_len=64)
    steps, every = (6, 2) if args.quick else (12, 2)
    base = {"model": model, "global_batch": 8, "steps": steps, "optimizer": "adam"}
    figures = {"cores": os.cpu_count(), "quick": args.quick, "model": str(model),
               "parameters": count_parameters(model), "steps": steps, "every": every,
               "layouts": {}}
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        for name, fields in LAYOUTS.items():
            entry = _layout(cluster, {**base, **fields}, every)
            figures["layouts"][name] = entry
            print(f"{name:5s} {entry['bytes_per_rank'] / 2**20:6.2f} MiB/rank; save "
                  f"{1e3 * entry['blocking_save_s']:6.1f} ms blocking, async stall "
                  f"{1e3 * entry['async_stall_s']:6.1f} ms (written in "
                  f"{1e3 * entry['async_write_s']:6.1f} ms); step "
                  f"{1e3 * entry['step_s']:6.1f} ms; wall x{entry['wall_ratio_blocking']}"
                  f" blocking, x{entry['wall_ratio_async']} async", flush=True)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
