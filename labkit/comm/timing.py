"""Measure how long an AllReduce takes on this cluster, per message size.

Bandwidth figures follow the convention of NVIDIA's nccl-tests: *algorithm bandwidth* is
bytes / time; *bus bandwidth* multiplies it by 2(N-1)/N, the share of the data each link
carries in a ring AllReduce, so that it can be compared with a link's peak.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from labkit.costs import ring_share

MIB = 1 << 20


def _all_reduce_times(ctx, sizes_bytes: list[int], repeats: int) -> list[float]:
    """On each rank: median seconds of one float32 all_reduce per size (after a warm-up)."""
    medians = []
    for nbytes in sizes_bytes:
        tensor = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=ctx.device)
        dist.all_reduce(tensor, group=ctx.group)  # warm-up: connections, buffers
        times = []
        for _ in range(repeats):
            dist.barrier(group=ctx.group)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            dist.all_reduce(tensor, group=ctx.group)
            if ctx.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        medians.append(statistics.median(times))
        ctx.progress(len(medians), len(sizes_bytes), "all_reduce sizes")
    return medians


@dataclass
class CollectiveTimings:
    """Measured all_reduce times: one row per message size (slowest rank's median)."""

    world_size: int
    device: str
    oversubscribed: bool
    sizes_bytes: list[int]
    seconds: list[float]
    rows: list[dict] = field(init=False)

    def __post_init__(self):
        share = ring_share("all_reduce", self.world_size)  # 2(N-1)/N
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
        return (f"<b>all_reduce on {self.world_size} {self.device} ranks, measured here{note}"
                f"</b><table><tr>{head}</tr>{body}</table>")


def time_all_reduce(cluster, sizes_bytes=(MIB // 4, MIB, 4 * MIB, 16 * MIB),
                    repeats: int = 5) -> CollectiveTimings:
    """Time a float32 all_reduce of each size on every rank of ``cluster``."""
    sizes = [int(s) for s in sizes_bytes]
    if not sizes or min(sizes) < 4 or repeats < 1:
        raise ValueError("sizes_bytes must be at least 4 bytes each and repeats at least 1")
    per_rank = cluster.run(_all_reduce_times, sizes, repeats)
    slowest = [max(times) for times in zip(*per_rank, strict=True)]
    return CollectiveTimings(cluster.world_size, cluster.device, cluster.oversubscribed,
                             sizes, slowest)
