"""Devices that take turns: what a step costs in device time when N devices work one after
another (a loop handing each slice of the batch to the next GPU) instead of together.

Both modes run in one job on the same ranks, the same model and the same slices: each rank
runs forward and backward on its slice of the batch, then the gradients are averaged. Taking
turns, rank r starts only when rank r-1 hands it a token. A device is paid for while it is
held, busy or not, so the cost of a step is N x its wall time ("device-seconds").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from labkit.lessons.show.table import html_table
from labkit.models import build_model, loss_fn, make_batch


def _slice_step(model, config, rank: int, world_size: int) -> tuple[float, float]:
    """Forward and backward of this rank's slice: (start, end) on the machine's clock."""
    inputs, targets = make_batch(config.model, 0, config.global_batch, config.seed)
    share = config.global_batch // world_size
    start = time.time()
    chunk = slice(rank * share, (rank + 1) * share)
    loss_fn(config.model)(model(inputs[chunk]), targets[chunk]).backward()
    return start, time.time()


def _turns_job(ctx, config, repeats: int) -> list[dict]:
    model = build_model(config.model, ctx.device, config.seed)
    token = torch.zeros(1)
    rounds = []
    for _ in range(repeats + 1):  # the first round warms up, and is dropped
        timed = {}
        for mode in ("together", "turns"):
            ctx.barrier()
            ready = time.time()
            if mode == "turns" and ctx.rank > 0:
                dist.recv(token, ctx.rank - 1)  # wait for the previous device's turn
            start, end = _slice_step(model, config, ctx.rank, ctx.world_size)
            if mode == "turns" and ctx.rank < ctx.world_size - 1:
                dist.send(token, ctx.rank + 1)
            for p in model.parameters():  # gradients averaged as usual (not timed)
                dist.all_reduce(p.grad)
                p.grad = None
            timed[mode] = (ready, end, end - start)
        rounds.append(timed)
    return rounds[1:]


@dataclass
class TakingTurns:
    """Median wall time of a step, and each device's busy time, in both modes."""

    world_size: int
    wall_s: dict  # mode -> seconds
    busy_s: dict  # mode -> [seconds per rank]
    oversubscribed: bool

    def device_seconds(self, mode: str) -> float:
        return self.world_size * self.wall_s[mode]

    def utilisation(self, mode: str) -> float:
        return sum(self.busy_s[mode]) / self.device_seconds(mode)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "wall_s": self.wall_s, "busy_s": self.busy_s,
                "device_seconds": {m: self.device_seconds(m) for m in self.wall_s},
                "utilisation": {m: self.utilisation(m) for m in self.wall_s},
                "oversubscribed": self.oversubscribed}

    def _repr_html_(self) -> str:
        rows = [[mode, f"{1e3 * self.wall_s[mode]:.1f}",
                 f"{1e3 * self.device_seconds(mode):.1f}", f"{self.utilisation(mode):.0%}"]
                for mode in ("together", "turns")]
        note = "measured here" + (" (oversubscribed: ranks share cores)"
                                  if self.oversubscribed else "")
        return html_table(f"{self.world_size} devices, one step", [
            "mode", "wall time (ms)", "device time paid for (ms)", "devices busy"], rows, note)


def taking_turns(cluster, config, repeats: int = 3) -> TakingTurns:
    """Measure forward and backward of one step on every rank of ``cluster``, the ranks
    working together, then in turns (the median of ``repeats`` rounds). Wall time runs from
    the moment all ranks are ready to the moment the last one is done (one clock: the
    machine's, shared by the ranks)."""
    ranks = cluster.run(_turns_job, config, repeats)
    wall, busy = {}, {}
    for mode in ("together", "turns"):
        walls = sorted(max(r[i][mode][1] for r in ranks) - min(r[i][mode][0] for r in ranks)
                       for i in range(repeats))
        wall[mode] = walls[len(walls) // 2]
        busy[mode] = [sorted(x[mode][2] for x in r)[repeats // 2] for r in ranks]
    return TakingTurns(cluster.world_size, wall, busy, ranks.oversubscribed)
