"""The work of a step, split: FLOPs counted on each rank of a data-parallel step, and on one
device for the whole batch. Splitting the batch divides the work between devices; it does not
make it smaller, so each rank still needs a device fast enough for its share.

FLOPs are PyTorch's own count (``torch.utils.flop_counter.FlopCounterMode``); the rate is the
measured time of the same forward and backward on this rank's device.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from torch.utils.flop_counter import FlopCounterMode

from labkit.lessons.show.table import html_table
from labkit.models import build_model, loss_fn, make_batch


def _count(model, config, inputs, targets) -> tuple[int, float]:
    with FlopCounterMode(display=False) as counter:
        loss_fn(config.model)(model(inputs), targets).backward()
    start = time.perf_counter()
    loss_fn(config.model)(model(inputs), targets).backward()
    return counter.get_total_flops(), time.perf_counter() - start


def _work_job(ctx, config) -> dict:
    model = build_model(config.model, ctx.device, config.seed)
    inputs, targets = make_batch(config.model, 0, config.global_batch, config.seed)
    share = config.global_batch // ctx.world_size
    mine = slice(ctx.rank * share, (ctx.rank + 1) * share)
    flops, seconds = _count(model, config, inputs[mine], targets[mine])
    out = {"flops": flops, "seconds": seconds}
    if ctx.rank == 0:
        out["whole_flops"] = _count(model, config, inputs, targets)[0]
    return out


@dataclass
class WorkSplit:
    world_size: int
    flops: list[int]  # per rank
    seconds: list[float]
    whole_flops: int  # one device, the whole batch

    @property
    def flops_per_s(self) -> float:
        """Measured rate of one rank's device (the median rank)."""
        rates = sorted(f / s for f, s in zip(self.flops, self.seconds, strict=True))
        return rates[len(rates) // 2]

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "flops": self.flops, "seconds": self.seconds,
                "whole_flops": self.whole_flops, "flops_per_s": self.flops_per_s}

    def _repr_html_(self) -> str:
        rows = [[f"rank {r}", f"{f:.3g}", f"{f / self.whole_flops:.0%}"]
                for r, f in enumerate(self.flops)]
        rows.append(["all ranks together", f"{sum(self.flops):.3g}",
                     f"{sum(self.flops) / self.whole_flops:.0%}"])
        rows.append(["one device, whole batch", f"{self.whole_flops:.3g}", "100%"])
        return html_table("FLOPs of one forward and backward", ["who", "FLOPs", "of one device's"],
                          rows, f"counted here; one rank's device ran "
                          f"{self.flops_per_s / 1e9:.2f} GFLOP/s (measured)")


def work_per_rank(cluster, config) -> WorkSplit:
    if config.global_batch % cluster.world_size:
        raise ValueError(f"global_batch {config.global_batch} does not split over "
                         f"{cluster.world_size} ranks: choose a multiple")
    ranks = cluster.run(_work_job, config)
    return WorkSplit(cluster.world_size, [r["flops"] for r in ranks],
                     [r["seconds"] for r in ranks], ranks[0]["whole_flops"])
