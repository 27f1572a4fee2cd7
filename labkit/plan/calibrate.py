"""Measure this machine, so that the planner's numbers for it are measured, not assumed.

``calibrate(cluster)`` runs on every rank of ``cluster`` at once. Compute figures are timed
in each rank's CPU time (what the work costs one core, whatever else runs on the machine);
ranks that outnumber the cores are then modelled explicitly (``Calibration.core_share``:
compute takes ranks / cores times longer), not measured as noise:

* matmul FLOP/s: the median over three classroom shapes (the zoo's layers at classroom
  sizes: a few thousand rows by 128 to 1024) of the median of a few timed float32 matmuls;
* memory bandwidth: the bytes per second of the zoo's bandwidth-bound ops as a CPU runs
  them (GELU, LayerNorm and Adam's update at classroom sizes, bytes counted as the model's
  are): a copy moves 2-3x faster than GELU's or Adam's arithmetic lets them, and the
  projection charges those ops;
* an op's fixed cost: the training step of an MLP 8 wide (no arithmetic to speak of) over
  the ops counted in it (on small models the framework, not the arithmetic, takes most of
  a step: this is the term that sees it);
* memory per rank: the cluster's cap, else this machine's memory (from the OS) over the ranks;
* each collective's alpha and beta: ``labkit.runtime.comm.time_collectives`` over a few sizes
  and its ``fit`` (two ranks at least);
* what tp's DTensors and FSDP2's hooks add per parameter tensor and per weight byte
  (``labkit.plan.engines``: a tiny decoder's step under each engine against it plain, two
  ranks at least);
* what meeting in collectives adds to compute (``labkit.plan.jitter``: segments of matmuls
  between small AllReduces against the AllReduces alone; two ranks at least, no more ranks
  than cores).

``Calibration.cluster()`` is a ``labkit.plan.GPUCluster`` of these figures (efficiency 1: the
matmuls were measured), for ``project`` and ``search`` like any named cluster.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from labkit.models import MLPConfig, build_model, example_batch, loss_fn
from labkit.plan.cluster import GPUCluster
from labkit.plan.counts import OpBytes
from labkit.plan.engines import cpu_median, engine_runs, fit_overhead, measure_engine_overhead
from labkit.plan.hardware import GPU
from labkit.plan.jitter import fit_jitter, measure_jitter
from labkit.plan.project import sample_ops
from labkit.runtime.comm.timing import time_collectives

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "send")
# 4 KiB .. 8 MiB, 2x apart: classroom messages, up to a classroom model's gradients (3.5 MB
# for the GPT, 9.6 MB for the MLP: fitted only up to 1 MiB, a 9.5 MB AllReduce on 2 ranks
# took 10.7 ms where the fit said 6.6)
SIZES = tuple(1 << k for k in range(12, 24))
# Collectives are timed in this many interleaved rounds, each size summarised by a low
# quantile (labkit.runtime.comm.timing): with 5 rounds the minimum of a few noisy samples decided
# the fit (4 ranks on 2 cores once fitted alpha 3.8 ms and an infinite bandwidth).
COLLECTIVE_ROUNDS = 40
MATMULS = ((1024, 128, 512), (1024, 512, 128), (256, 1024, 1024))  # (rows, inner, columns)


def _best(fn, repeats: int) -> float:
    """The median of ``repeats`` timings (after a warm-up), in this process's CPU time: what
    the work costs a core, whatever else shares the machine (other programs, the other ranks);
    ``Calibration.cluster`` then shares the cores among the ranks explicitly. One warm-up:
    the allocator's first blocks, the kernels' first dispatch; never 0 (it divides)."""
    return max(cpu_median(fn, repeats, warmups=1), 1e-9)


def _cores() -> int:
    """Cores this process may run on (its affinity: a container's or taskset's limit)."""
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# A model so narrow that its arithmetic is nothing: its step is the framework's cost per op
# (dispatch, autograd, the optimizer's loop), divided by the ops counted for it.
TINY = MLPConfig(d_in=8, d_hidden=8, n_layers=4, d_out=2)


def _tiny_step():
    model = build_model(TINY)
    optimizer = torch.optim.Adam(model.parameters())
    inputs, targets = example_batch(TINY, 1)

    def step():
        optimizer.zero_grad()
        loss_fn(TINY)(model(inputs), targets).backward()
        optimizer.step()

    return step


def _elementwise_work():
    """The zoo's bandwidth-bound ops at classroom sizes: GELU and LayerNorm, forward and
    backward, on a micro-batch's activations (1024 tokens x 512 and x 128), and Adam's update
    of 1M parameters (its 19 arrays' passes)."""
    x = torch.randn(1024, 512, requires_grad=True)
    h = torch.randn(1024, 128, requires_grad=True)
    norm = torch.nn.LayerNorm(128)
    grad_x, grad_h = torch.randn_like(x), torch.randn_like(h)
    weights = torch.randn(1 << 20, requires_grad=True)
    weights.grad = torch.randn_like(weights)
    adam = torch.optim.Adam([weights])
    adam.step()  # the state exists from here on

    def work():
        x.grad = h.grad = None
        torch.nn.functional.gelu(x).backward(grad_x)
        norm(h).backward(grad_h)
        adam.step()

    return work


def _bytes_per_second(work, repeats: int) -> float:
    """Bytes ``work``'s ops read and write (counted as the model's are: ``counts.OpBytes``)
    per second of its CPU time."""
    counter = OpBytes()
    with counter:
        work()
    return counter.bytes / _best(work, repeats)


def _measure_rank(ctx, repeats: int) -> dict:
    """On each rank: matmul FLOP/s, the bandwidth-bound ops' bytes/s, seconds per tiny op."""
    rates = []
    for m, k, n in MATMULS:
        a, b = torch.randn(m, k), torch.randn(k, n)
        rates.append(2 * m * k * n / _best(lambda a=a, b=b: torch.mm(a, b), repeats))
    op_s = _best(_tiny_step(), repeats) / sample_ops(TINY)
    return {"flops": sorted(rates)[len(rates) // 2],
            "bandwidth": _bytes_per_second(_elementwise_work(), repeats), "op_s": op_s}


@dataclass
class Calibration:
    """This machine's figures, measured on ``world_size`` ranks at once."""

    world_size: int
    matmul_flops: float
    memory_bandwidth: float
    op_overhead_s: float
    memory_bytes: float
    links: dict = field(default_factory=dict)  # {kind: AlphaBeta}
    oversubscribed: bool = False
    cores: int = field(default_factory=_cores)
    # {engine: (s per parameter tensor, s per weight byte)} tp / fsdp add (engines.py)
    engine_overhead: dict = field(default_factory=dict)
    sync_jitter: float = 0.0  # what meeting in collectives adds to compute (jitter.py)

    @property
    def core_share(self) -> float:
        """Ranks per core when there are more ranks than cores (each rank then gets this
        fraction of a core's time): compute takes ranks / cores times longer."""
        return max(1.0, self.world_size / max(self.cores, 1))

    def cluster(self) -> GPUCluster:
        """A ``GPUCluster`` of this machine's ranks, every figure measured (CPU time per rank),
        compute slowed by ``core_share`` when ranks outnumber cores."""
        link = self.links.get("all_reduce")
        bandwidth = link.bandwidth if link is not None else float("inf")
        share = self.core_share
        here = GPU("this machine (measured)", self.memory_bytes, self.matmul_flops / share,
                   self.matmul_flops / share, self.memory_bandwidth / share, self.world_size,
                   bandwidth, 0.0,
                   "measured by labkit.plan.calibrate", "one rank = one virtual GPU (a core)",
                   measured=True)
        alpha = link.latency_per_step if link is not None else 0.0
        return GPUCluster(here, self.world_size, 1, efficiency=1.0, alpha_s=(alpha, alpha),
                       op_overhead_s=self.op_overhead_s * share,
                       measured_links=dict(self.links),
                       engine_overhead_s=tuple((e, per_tensor * share) for e, (per_tensor, _)
                                               in sorted(self.engine_overhead.items())),
                       sync_jitter=self.sync_jitter)

    def to_dict(self) -> dict:
        return {"world_size": self.world_size, "matmul_flops": self.matmul_flops,
                "memory_bandwidth": self.memory_bandwidth, "op_overhead_s": self.op_overhead_s,
                "links": {k: v.to_dict() for k, v in self.links.items()},
                "oversubscribed": self.oversubscribed, "cores": self.cores,
                "engine_overhead": {e: list(v) for e, v in self.engine_overhead.items()},
                "sync_jitter": self.sync_jitter}


def _host_memory_per_rank(world_size: int) -> float:
    """Without a cap, the ranks share this machine's memory: its total (measured from the
    OS) over the ranks."""
    import os

    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return total / max(world_size, 1)


def calibrate(cluster, repeats: int = 5, kinds=KINDS,
              sizes_bytes=SIZES) -> Calibration:
    """Measure matmul FLOP/s, bandwidth and per-op cost on every rank of ``cluster`` (the
    slowest rank's), and each collective's alpha-beta fit when it has 2 ranks or more."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"calibrate(repeats={repeats!r}): a whole number of timings, at least 1")
    if not (hasattr(cluster, "run") and hasattr(cluster, "world_size")):
        raise TypeError(f"calibrate() measures the ranks of a labkit.Cluster (labkit.Cluster(2, "
                        f"device='cpu')), not {type(cluster).__name__}: a labkit.plan.GPUCluster "
                        f"names hardware to project on, it has no ranks to time")
    cap = cluster.memory_per_device
    # the probes time the machine, not a virtual GPU's budget: a small cap (a lesson's 8 MiB)
    # would stop them with a DeviceOOM about batch sizes; the cap is the memory reported
    cluster.memory_per_device = None
    try:
        per_rank = cluster.run(_measure_rank, repeats)
        links, engines, jitter = {}, {}, 0.0
        if cluster.world_size > 1:
            sweep = time_collectives(cluster, kinds, sizes_bytes,
                                     max(repeats, COLLECTIVE_ROUNDS))
            links = sweep.fits()
            runs = engine_runs(cluster.world_size, cluster.device, cluster.backend)
            engines = fit_overhead(cluster.run(measure_engine_overhead, runs, repeats))
            if cluster.world_size <= _cores():  # ranks over cores: core_share (jitter.py)
                jitter = fit_jitter(cluster.run(measure_jitter, repeats))
    finally:
        cluster.memory_per_device = cap
    capacity = cap or _host_memory_per_rank(cluster.world_size)
    return Calibration(cluster.world_size, min(r["flops"] for r in per_rank),
                       min(r["bandwidth"] for r in per_rank),
                       max(r["op_s"] for r in per_rank), float(capacity), links,
                       bool(getattr(cluster, "oversubscribed", False)),
                       engine_overhead=engines, sync_jitter=jitter)
