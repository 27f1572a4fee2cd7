"""Estimate a rank's peak memory without allocating it, for any layout.

``estimate_memory`` builds the run's model with the very build path that training uses
(``labkit/training/build``: meta device, tensor parallel, pipeline split, FSDP2, the allocator)
and runs its steps on *fake tensors*: PyTorch's ``FakeTensorMode`` gives every tensor a shape,
dtype and device but no storage, and ``MemoryTracker`` counts the bytes each op would allocate,
phase by phase. The process group is PyTorch's "fake" one (collectives do nothing), made for
the rank being traced, so the engines (FSDP2's shards and padding, ZeRO's uneven split,
DTensor's local shards) are the real ones. So the estimate follows what the step really holds
at each moment (activations freed before the optimizer step, Adam's state created lazily at the
first step), for any size: a 70B-parameter decoder costs a few seconds and no memory.

Ranks whose memory can differ are traced one by one (each pipeline stage; each rank of a
group that shares embedding tables) and the highest peak is the estimate. A pipeline stage is
stepped through its schedule's order (``parallel/pipeline/trace.py``). What lives outside the
traced step is added from its documented size (DDP's gradient buckets: DDP does not run on
fake tensors).

The ZeRO paper's analytic count is ``labkit.runtime.costs.model_state_bytes``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.distributed.tensor import DTensor
from torch.testing._internal.distributed.fake_pg import FakeStore

from labkit.models import example_batch, loss_fn
from labkit.parallel.context.apply import shard_batch
from labkit.parallel.data.ddp import bucket_bytes
from labkit.parallel.pipeline.trace import PipelineTrace
from labkit.runtime.comm.clock import HostClock
from labkit.runtime.costs import model_state_bytes
from labkit.runtime.memory.oom import CATEGORIES
from labkit.runtime.memory.tracker import MemoryTracker, relabel_live
from labkit.runtime.memory.units import format_bytes
from labkit.runtime.meshes import forget_meshes
from labkit.training.build import ParallelContext, build
from labkit.training.build.build import plain_ddp
from labkit.training.layout.mesh import build_mesh
from labkit.training.run import Run, resolve
from labkit.training.step.spmd import micro_steps, run_step, step_precision

__all__ = ["MemoryEstimate", "estimate_memory", "model_state_bytes"]


@dataclass
class MemoryEstimate:
    """A rank's estimated peak: bytes by category at the peak, and the phase it falls in.

    ``rank`` is the traced rank with the highest peak; ``per_rank`` the peak of every rank
    traced (one per pipeline stage, or per rank of a table group; else rank 0 alone);
    ``category_peaks`` each category's own highest value on that rank (gradients peak after
    backward, activations during it: not at the same moment)."""

    strategy: str
    world_size: int
    batch_per_rank: int
    peak_bytes: int
    peak_phase: str
    at_peak: dict[str, int]
    method: str = "traced on fake tensors"
    extras: dict[str, int] = field(default_factory=dict)
    rank: int = 0
    per_rank: dict[int, int] = field(default_factory=dict)
    category_peaks: dict[str, int] = field(default_factory=dict)

    def fits(self, capacity_bytes: int) -> bool:
        return self.peak_bytes <= capacity_bytes

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{c}</td><td>{format_bytes(self.at_peak.get(c, 0))}</td></tr>"
                       for c in CATEGORIES)
        return (f"<b>estimated peak per rank: {format_bytes(self.peak_bytes)}</b> "
                f"({self.strategy} on {self.world_size}, {self.batch_per_rank} samples per "
                f"rank, peak during {self.peak_phase}, rank {self.rank}; {self.method})"
                f"<table>{rows}</table>")


@contextlib.contextmanager
def _fake_group(world_size: int, rank: int):
    """A process group that exists only in this process (PyTorch's "fake" backend), as rank
    ``rank`` of ``world_size``. ``init_process_group`` also wraps ``sys.excepthook`` to
    prefix errors with "[rank0]:" and ``destroy_process_group`` leaves it: put it back."""
    if dist.is_initialized():
        raise RuntimeError("estimate_memory traces on a fake process group of its own; call it "
                           "from the notebook (or before init_process_group), not from a rank")
    excepthook = sys.excepthook
    forget_meshes()  # DTensor's caches may hold the meshes of another rank or world
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        forget_meshes()  # and this fake world's must not reach a later one
        sys.excepthook = excepthook


def _traced_ranks(run: Run) -> list[int]:
    """Ranks whose memory may differ: one per pipeline stage, one per rank of a group that
    shares embedding tables; the others hold what one of these holds."""
    layout = run.layout
    stages = range(layout.pp)
    shards = range(layout.fsdp) if run.engines.tables is not None else [0]
    return sorted({layout.rank_at(pp=p, fsdp=f) for p in stages for f in shards})


def _steps(built, ctx: ParallelContext, batch_size: int, tracker) -> None:
    """The training steps on fake tensors; the peak of the last ones."""
    config, layout = ctx.config, ctx.layout
    steps = 2  # the second step holds the optimizer state the first one made
    if any(isinstance(p, DTensor) for part in built.parts for p in part.parameters()):
        # The first DTensor op of each kind fills DTensor's sharding-propagation cache by
        # running the op on fake tensors of the whole size. A real run does not count those
        # (the tracker skips fake tensors there); here every tensor is fake, so they would
        # be counted. One more step, and the peak of the later ones.
        steps += 1
    pipeline = None
    if built.pipeline is not None:
        pipeline = PipelineTrace(built, ctx.run, ctx.coordinate("pp"),
                                 [ctx.coordinate("pp") + v * layout.pp
                                  for v in range(ctx.engines.stages_per_rank)])
    for step in range(steps):
        if step == steps - 2:
            tracker.reset_peak()
        batch = example_batch(config.model, batch_size)
        batch = shard_batch(batch, ctx.coordinate("cp"), layout.cp)
        if pipeline is not None:
            pipeline.step(batch, built.optimizer, built.sync_gradients)
        else:
            run_step(built.model, batch, loss_fn(config.model), built.optimizer,
                     step_precision(config, built), built.sync_gradients,
                     micro_batches=micro_steps(config), no_sync=built.no_sync)


def _untraced_bytes(built, run: Run) -> int:
    """Memory kept outside the traced step: DDP's gradient buckets (DDP does not run on fake
    tensors, so the build leaves the replica unwrapped here; DDP allocates its buckets even
    on one rank)."""
    return sum(bucket_bytes(p) for p in built.parts) if plain_ddp(run) else 0


def _trace(run: Run, rank: int) -> dict:
    """Peak of the training steps of ``run`` on rank ``rank``, on fake tensors."""
    batch_size = run.config.global_batch // run.layout.data_size
    with _fake_group(run.world_size, rank):
        mesh = build_mesh(run.layout, "cpu")  # its groups go with the fake group
        # Real inputs allowed: the model is built on the meta device before fake tensors.
        fake = FakeTensorMode(allow_non_fake_inputs=True)
        with fake, MemoryTracker(count_fake=True) as tracker:
            ctx = ParallelContext(rank, run.world_size, torch.device("cpu"), tracker, run, mesh,
                                  HostClock())
            built = build(ctx)
            tracker.track_external(*built.modules, built.optimizer)
            relabel_live(tracker)
            _steps(built, ctx, batch_size, tracker)
            report = tracker.report()
    report["untraced_bytes"] = _untraced_bytes(built, run)
    return report


def _traced_run(run: Run) -> Run:
    """The run as the estimator traces it: CPU ranks of a fake group, whose context
    parallelism is labkit's ring (PyTorch's engine does not run there)."""
    engines = run.engines
    if engines.cp_engine is not None:
        engines = dataclasses.replace(engines, cp_engine="ring")
    return run.replace(engines=engines, device_type="cpu", backend="fake")


def estimate_memory(config, world_size: int = 1) -> MemoryEstimate:
    """Estimated peak bytes per rank for training ``config`` on ``world_size`` ranks: a
    ``TrainConfig`` (resolved here, with its layout or its strategy's preset) or a resolved
    ``Run`` (``labkit.train`` passes its own; ``world_size`` is then the run's). Nothing is
    allocated and no rank starts; any model size works."""
    run = config if isinstance(config, Run) else resolve(config, world_size)
    config, world_size, layout = run.config, run.world_size, run.layout
    traced_run = _traced_run(run)
    traces = {rank: _trace(traced_run, rank) for rank in _traced_ranks(run)}
    totals = {rank: t["peak_bytes"] + t["untraced_bytes"] for rank, t in traces.items()}
    worst = max(totals, key=totals.get)
    traced = traces[worst]
    at_peak = {c: int(traced["at_peak"][c]) for c in CATEGORIES}
    extras = {}
    if traced["untraced_bytes"]:  # DDP allocates its buckets even on one rank
        extras["ddp_buckets"] = traced["untraced_bytes"]
        at_peak["other"] += traced["untraced_bytes"]
    peaks = {c: int(traced["category_peaks"][c]) for c in CATEGORIES}
    peaks["other"] += traced["untraced_bytes"]
    return MemoryEstimate(config.label, world_size, config.global_batch // layout.data_size,
                          sum(at_peak.values()), traced["peak_phase"], at_peak, extras=extras,
                          rank=worst, per_rank=totals, category_peaks=peaks)
