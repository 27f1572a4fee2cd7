"""Measure how long each collective takes on this cluster, per message size.

Bandwidth figures follow the convention of NVIDIA's nccl-tests: *algorithm bandwidth* is
bytes / time; *bus bandwidth* multiplies it by the share of the data each link carries on a
ring (2(N-1)/N for AllReduce, (N-1)/N for the others: ``labkit.runtime.costs.ring_share``), so that
collectives and rank counts can be compared with a link's peak. ``time_collectives`` measures
several collectives over sizes; ``CollectiveSweep.fit`` fits each one's alpha-beta model
(``alpha_beta.py``) to them.

A message's size is that of the full tensor the collective works on, as everywhere in labkit:
the AllReduced tensor, the gathered output, the reduce-scattered input, the tensor each rank
sends to its neighbour ("send": every rank sends to rank + 1 and receives from rank - 1 at
once, a ring's step).

Beyond a few MiB on CPU ranks, messages leave the cores' caches and the time per byte grows:
one alpha-beta line no longer holds across that bend (``bench/comm_model.py`` shows it).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from labkit.runtime.comm.alpha_beta import AlphaBeta, fit_alpha_beta
from labkit.runtime.costs import ring_share

MIB = 1 << 20
WARMUP = 2
QUANTILE = 0.2  # of the rounds at one size: see ``_estimate``
KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send")


def _buffers(ctx, largest: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Three float32 buffers of the largest message; every size's tensors are views of them
    (one allocation whatever the number of sizes, and every size's data already touched)."""
    numel = max(ctx.world_size, largest // 4 // ctx.world_size * ctx.world_size)
    return tuple(torch.ones(numel, dtype=torch.float32, device=ctx.device) for _ in range(3))


def _operation(ctx, kind: str, nbytes: int, buffers):
    """A function that runs one ``kind`` collective on a float32 tensor of ``nbytes``."""
    n, group = ctx.world_size, ctx.group
    numel = max(n, nbytes // 4 // n * n)  # splits evenly over the ranks
    full, piece, out = buffers[0][:numel], buffers[1][:numel // n], buffers[2][:numel]
    if kind == "all_reduce":
        return lambda: dist.all_reduce(full, group=group)
    if kind == "all_gather":
        return lambda: dist.all_gather_single(full, piece, group=group)
    if kind == "reduce_scatter":
        return lambda: dist.reduce_scatter_single(piece, full, group=group)
    if kind == "all_to_all":
        return lambda: dist.all_to_all_single(out, full, group=group)
    if kind == "broadcast":
        return lambda: dist.broadcast(full, src=0, group=group)

    def ring_step():  # "send": one step of a ring, every rank at once
        ops = [dist.P2POp(dist.isend, full, (ctx.rank + 1) % n, group),
               dist.P2POp(dist.irecv, out, (ctx.rank - 1) % n, group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()

    return ring_step


def _time_once(ctx, operation) -> tuple[float, float]:
    """When one collective started and ended on this rank (seconds on the host's monotonic
    clock, which every rank of one machine shares)."""
    dist.barrier(group=ctx.group)
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    operation()
    if ctx.device.type == "cuda":
        torch.cuda.synchronize()
    return start, time.perf_counter()


def _sweep_on_rank(ctx, kinds: list[str], sizes_bytes: list[int], repeats: int) -> dict:
    """On each rank: ``repeats`` timings of every (collective, size), interleaved: each round
    visits every pair once in an order shuffled per round (the same on every rank, seeded by
    the round), so that a burst of load elsewhere on the machine lands on a few samples of
    many sizes, not on every sample of one size. Returns {kind: [[(start, end) per round] per
    size]}."""
    buffers = _buffers(ctx, max(sizes_bytes))
    pairs = [(kind, i) for kind in kinds for i in range(len(sizes_bytes))]
    operations = {(kind, i): _operation(ctx, kind, sizes_bytes[i], buffers) for kind, i in pairs}
    for operation in operations.values():
        for _ in range(WARMUP):  # connections, buffers, the allocator's first blocks
            operation()
    samples = {kind: [[] for _ in sizes_bytes] for kind in kinds}
    for round_ in range(repeats):
        order = list(pairs)
        random.Random(round_).shuffle(order)
        for kind, i in order:
            samples[kind][i].append(_time_once(ctx, operations[(kind, i)]))
        ctx.progress(round_ + 1, repeats, "rounds over every collective and size")
    return samples


def _estimate(per_rank: list[dict], kind: str) -> list[float]:
    """Per size: in each round, from the moment the last rank started to the moment the last
    rank finished (the barrier lets ranks go tens of microseconds apart; a rank that starts
    early only waits for the others), then a low quantile of the rounds (``QUANTILE``). Load
    on a shared machine only ever adds time, so the least-disturbed rounds estimate what the
    collective itself costs; their 20th percentile varies less from size to size than their
    minimum, which is one lucky round (measured on this 2-core machine under load: held-out
    errors of the fit 10-14% against 19-28% with the minimum, 100 rounds)."""
    rounds_per_size = zip(*(rank[kind] for rank in per_rank), strict=True)
    estimates = []
    for per_size in rounds_per_size:
        spans = sorted(max(end for _, end in ranks) - max(start for start, _ in ranks)
                       for ranks in zip(*per_size, strict=True))
        estimates.append(spans[int(QUANTILE * (len(spans) - 1))])  # the minimum below 6 rounds
    return estimates


@dataclass
class CollectiveTimings:
    """Measured times of one collective: one row per message size (a low quantile of the
    rounds, each from the last rank's start to the last rank's end: ``_estimate``)."""

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
    ranks at least): ``repeats`` rounds, collectives and sizes interleaved, each size
    summarised as in ``_estimate``. Ranks must share one host's clock (labkit's clusters do).
    For a fit that predicts sizes it did not see within 25% on a loaded 2-core machine, use
    sizes 2x apart from the latency regime (KiB) to the bandwidth one (MiB) and ~100 rounds
    (``tests/test_comm_model.py``)."""
    kinds = [kinds] if isinstance(kinds, str) else list(kinds)  # "all_reduce": one, not ten
    sizes = _check_sizes(sizes_bytes, repeats)
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown collectives {unknown}: choose from {', '.join(KINDS)}")
    if cluster.world_size < 2:
        raise ValueError("a collective needs two ranks at least: resize the cluster")
    per_rank = cluster.run(_sweep_on_rank, kinds, sizes, repeats)
    timings = {kind: CollectiveTimings(cluster.world_size, cluster.device,
                                       cluster.oversubscribed, sizes, _estimate(per_rank, kind),
                                       kind) for kind in kinds}
    return CollectiveSweep(timings)


def time_all_reduce(cluster, sizes_bytes=(MIB // 4, MIB, 4 * MIB, 16 * MIB),
                    repeats: int = 5) -> CollectiveTimings:
    """Time a float32 all_reduce of each size on every rank of ``cluster``."""
    sizes = _check_sizes(sizes_bytes, repeats)
    per_rank = cluster.run(_sweep_on_rank, ["all_reduce"], sizes, repeats)
    return CollectiveTimings(cluster.world_size, cluster.device, cluster.oversubscribed,
                             sizes, _estimate(per_rank, "all_reduce"))
