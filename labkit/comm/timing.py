"""Measure how long each collective takes on this cluster, per message size.

Bandwidth figures follow the convention of NVIDIA's nccl-tests: *algorithm bandwidth* is
bytes / time; *bus bandwidth* multiplies it by the share of the data each link carries on a
ring (2(N-1)/N for AllReduce, (N-1)/N for the others: ``labkit.costs.ring_share``), so that
collectives and rank counts can be compared with a link's peak. ``time_collectives`` measures
several collectives over sizes; ``CollectiveSweep.fit`` fits each one's alpha-beta model
(``alpha_beta.py``) to them.

A message's size is that of the full tensor the collective works on, as everywhere in labkit:
the AllReduced tensor, the gathered output, the reduce-scattered input, the tensor each rank
sends to its neighbour ("send": every rank sends to rank + 1 and receives from rank - 1 at
once, a ring's step).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from labkit.comm.alpha_beta import AlphaBeta, fit_alpha_beta
from labkit.costs import ring_share

MIB = 1 << 20
WARMUP = 2
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")


def _operation(ctx, kind: str, nbytes: int):
    """A function that runs one ``kind`` collective on a float32 tensor of ``nbytes``."""
    n, group = ctx.world_size, ctx.group
    numel = max(n, nbytes // 4 // n * n)  # splits evenly over the ranks
    full = torch.ones(numel, dtype=torch.float32, device=ctx.device)
    piece = torch.ones(numel // n, dtype=torch.float32, device=ctx.device)
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":
        return lambda: dist.all_gather_single(full, piece, group=group)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_single(piece, full, group=group)
    if kind == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=0, group=group)
    received = torch.empty_like(full)  # "send": one step of a ring, every rank at once

    def ring_step():
        ops = [dist.P2POp(dist.isend, full, (ctx.rank + 1) % n, group),
               dist.P2POp(dist.irecv, received, (ctx.rank - 1) % n, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return ring_step


def _collective_times(ctx, kind: str, sizes_bytes: list[int], repeats: int) -> list[float]:
    """On each rank: the fastest of ``repeats`` timings of one ``kind`` per size (after a
    warm-up)."""
    fastest = []
    for nbytes in sizes_bytes:
        operation = _operation(ctx, kind, nbytes)
        for _ in range(WARMUP):  # connections, buffers, the allocator's first blocks
            operation()
        times = []
        for _ in range(repeats):
            dist.barrier(group=ctx.group)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            operation()
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        fastest.append(min(times))
        ctx.progress(len(fastest), len(sizes_bytes), f"{kind} sizes")
    return fastest


def _sweep_on_rank(ctx, kinds: list[str], sizes_bytes: list[int], repeats: int) -> dict:
    return {kind: _collective_times(ctx, kind, sizes_bytes, repeats) for kind in kinds}


@dataclass
class CollectiveTimings:
    """Measured times of one collective: one row per message size (the slowest rank's
    fastest repeat: the least disturbed by whatever else the machine runs)."""

    world_size: int
    device: str
    oversubscribed: bool
    sizes_bytes: list[int]
    seconds: list[float]
    kind: str = "all_reduce"
    rows: list[dict] = field(init=False)

    def __post_init__(self):
        share = ring_share(self.kind, self.world_size)  # 2(N-1)/N for AllReduce
        self.rows = [{"bytes": b, "seconds": s, "algbw_GBps": b / s / 1e9,
                      "busbw_GBps": b / s / 1e9 * share}
                     for b, s in zip(self.sizes_bytes, self.seconds, strict=True)]

    @property
    def bus_bandwidth(self) -> float:
        """Bus bandwidth in bytes/s at the largest size measured (the plateau)."""
        return self.rows[-1]["busbw_GBps"] * 1e9

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("size", "time", "algbw", "busbw"))
        body = "".join(
            f"<tr><td>{r['bytes'] / MIB:.2f} MiB</td><td>{r['seconds'] * 1e3:.2f} ms</td>"
            f"<td>{r['algbw_GBps']:.2f} GB/s</td><td>{r['busbw_GBps']:.2f} GB/s</td></tr>"
            for r in self.rows)
        note = " (oversubscribed: ranks share cores)" if self.oversubscribed else ""
        return (f"<b>{self.kind} on {self.world_size} {self.device} ranks, measured here{note}"
                f"</b><table><tr>{head}</tr>{body}</table>")


    def fit(self) -> AlphaBeta:
        """The alpha-beta model fitted to every size measured."""
        return fit_alpha_beta(self.kind, self.world_size, self.sizes_bytes, self.seconds)


@dataclass
class CollectiveSweep:
    """Several collectives timed over the same sizes on the same ranks."""

    timings: dict[str, CollectiveTimings]

    def fit(self, kind: str, sizes_bytes=None) -> AlphaBeta:
        """``kind``'s alpha-beta model, fitted on ``sizes_bytes`` (default: all measured;
        give a subset to check the model on the sizes held out)."""
        timings = self.timings[kind]
        keep = set(timings.sizes_bytes if sizes_bytes is None else sizes_bytes)
        pairs = [(b, s) for b, s in zip(timings.sizes_bytes, timings.seconds, strict=True)
                 if b in keep]
        return fit_alpha_beta(kind, timings.world_size, *zip(*pairs, strict=True))

    def fits(self) -> dict[str, AlphaBeta]:
        return {kind: self.fit(kind) for kind in self.timings}

    def to_dict(self) -> dict:
        return {kind: {"sizes_bytes": t.sizes_bytes, "seconds": t.seconds,
                       "world_size": t.world_size} for kind, t in self.timings.items()}


def _check_sizes(sizes_bytes, repeats: int) -> list[int]:
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or min(sizes) < 4 or repeats < 1:
        raise ValueError("sizes_bytes must be at least 4 bytes each and repeats at least 1")
    return sizes


def time_collectives(cluster, kinds=KINDS, sizes_bytes=(MIB // 16, MIB // 4, MIB, 4 * MIB),
                     repeats: int = 5) -> CollectiveSweep:
    """Time each collective in ``kinds`` at each size on every rank of ``cluster`` (two
    ranks at least); the slowest rank's fastest repeat is kept."""
    kinds, sizes = list(kinds), _check_sizes(sizes_bytes, repeats)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown collectives {unknown}: choose from {', '.join(KINDS)}")
    if cluster.world_size < 2:
        raise ValueError("a collective needs two ranks at least: resize the cluster")
    per_rank = cluster.run(_sweep_on_rank, kinds, sizes, repeats)
    timings = {}
    for kind in kinds:
        slowest = [max(times) for times in zip(*(r[kind] for r in per_rank), strict=True)]
        timings[kind] = CollectiveTimings(cluster.world_size, cluster.device,
                                          cluster.oversubscribed, sizes, slowest, kind)
    return CollectiveSweep(timings)


def time_all_reduce(cluster, sizes_bytes=(MIB // 4, MIB, 4 * MIB, 16 * MIB),
                    repeats: int = 5) -> CollectiveTimings:
    """Time a float32 all_reduce of each size on every rank of ``cluster``."""
    sizes = _check_sizes(sizes_bytes, repeats)
    per_rank = cluster.run(_sweep_on_rank, ["all_reduce"], sizes, repeats)
    slowest = [max(times) for times in zip(*(r["all_reduce"] for r in per_rank), strict=True)]
    return CollectiveTimings(cluster.world_size, cluster.device, cluster.oversubscribed,
                             sizes, slowest)
