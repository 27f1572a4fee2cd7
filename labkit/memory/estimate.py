"""Estimate a rank's peak memory without allocating it, and the ZeRO paper's model states.

``estimate_memory`` runs the very training step that labkit measures (``train/step.py``) on
*fake tensors*: PyTorch's ``FakeTensorMode`` gives every tensor a shape, dtype and device but
no storage, and ``MemoryTracker`` counts the bytes each op would allocate, phase by phase. So
the estimate follows what the step really holds at each moment (activations freed before the
optimizer step, Adam's state created lazily at the first step), for any size: a 70B-parameter
decoder costs a few seconds and no memory. Strategy-specific buffers that live outside the
step (DDP's gradient buckets) are added from their documented size.

``model_state_bytes`` is the analytic count of Rajbhandari et al., "ZeRO: Memory Optimizations
Toward Training Trillion Parameter Models" (2020), section 3.1 and Figure 1.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from types import SimpleNamespace

from torch._subclasses.fake_tensor import FakeTensorMode

from labkit.memory.oom import CATEGORIES
from labkit.memory.tracker import MemoryTracker, relabel_live
from labkit.memory.units import format_bytes

# Bytes per parameter of model state (ZeRO paper, section 3.1): fp16 weights and gradients
# (2 + 2) and K = 12 of fp32 optimizer state (master weights, momentum, variance) in mixed
# precision; plain fp32 Adam holds 4 + 4 bytes and K = 8.
_STATE_BYTES = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}


def model_state_bytes(n_params: float, world_size: int = 1, zero_stage: int = 0,
                      precision: str = "mixed") -> dict[str, float]:
    """Per-device bytes of parameters, gradients and Adam state under ZeRO stage 0-3."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError("zero_stage is 0 (plain data parallel), 1, 2 or 3")
    p_bytes, g_bytes, k_bytes = _STATE_BYTES[precision]
    n = world_size
    out = {"parameters": p_bytes * n_params / (n if zero_stage >= 3 else 1),
           "gradients": g_bytes * n_params / (n if zero_stage >= 2 else 1),
           "optimizer": k_bytes * n_params / (n if zero_stage >= 1 else 1)}
    out["total"] = sum(out.values())
    return out


@dataclass
class MemoryEstimate:
    """A rank's estimated peak: bytes by category at the peak, and the phase it falls in."""

    strategy: str
    world_size: int
    batch_per_rank: int
    peak_bytes: int
    peak_phase: str
    at_peak: dict[str, int]
    method: str = "traced on fake tensors"
    extras: dict[str, int] = field(default_factory=dict)

    def fits(self, capacity_bytes: int) -> bool:
        return self.peak_bytes <= capacity_bytes

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{c}</td><td>{format_bytes(self.at_peak.get(c, 0))}</td></tr>"
                       for c in CATEGORIES)
        return (f"<b>estimated peak per rank: {format_bytes(self.peak_bytes)}</b> "
                f"({self.strategy} on {self.world_size}, {self.batch_per_rank} samples per "
                f"rank, peak during {self.peak_phase}; {self.method})<table>{rows}</table>")


@contextlib.contextmanager
def _fake_group(world_size: int):
    """A process group of ``world_size`` ranks that exists only in this process (PyTorch's
    "fake" backend: collectives do nothing), so that a sharded engine can be set up and
    traced as rank 0 of N without starting N processes."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise RuntimeError("estimate_memory traces sharded strategies in a process without a "
                           "process group; call it from the notebook, not from a rank")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _traced_step_peak(config, batch_size: int, world_size: int = 1, steps: int = 2) -> dict:
    """Peak of ``steps`` steps of ``config`` (a TrainConfig) on rank 0 of ``world_size``, on
    fake tensors. Sharded strategies build their real engine (FSDP2's ``fully_shard``, ZeRO's
    optimizer) on a fake process group, so their shards are the ones a run holds."""
    import torch

    from labkit.models import example_batch, loss_fn
    from labkit.train.step import run_step
    from labkit.train.strategy import strategy_for

    strategy = strategy_for(config.strategy)
    group = _fake_group(world_size) if strategy.sharded else contextlib.nullcontext()
    with group, FakeTensorMode(), MemoryTracker(count_fake=True) as tracker:
        ctx = SimpleNamespace(rank=0, world_size=world_size, device=torch.device("cpu"),
                              memory=tracker, estimating=True)
        model = strategy.build(ctx, config)
        optimizer = strategy.make_optimizer(model, config)
        tracker.track_external(model, optimizer)
        relabel_live(tracker)
        if strategy.sharded:
            # The first DTensor op of each kind fills DTensor's sharding-propagation cache by
            # running the op on fake tensors of the whole size. A real run does not count
            # those (the tracker skips fake tensors there); here every tensor is fake, so they
            # would be counted. One more step, and the peak of the later ones.
            steps += 1
        for step in range(steps):  # the second step holds optimizer state from the first
            if strategy.sharded and step == 1:
                tracker.reset_peak()
            run_step(model, example_batch(config.model, batch_size), loss_fn(config.model),
                     optimizer, config.precision, micro_batches=config.micro_batches)
        return tracker.report()


def _ddp_bucket_bytes(config) -> int:
    """DDP keeps one flat bucket buffer per bucket: as many bytes as the parameters."""
    from labkit.models import count_parameters

    element = 2 if config.precision == "bf16" else 4
    return count_parameters(config.model) * element


def estimate_memory(config, world_size: int = 1) -> MemoryEstimate:
    """Estimated peak bytes per rank for training ``config`` (a ``TrainConfig``) on
    ``world_size`` ranks. Nothing is allocated; any model size works."""
    from labkit.train.strategy import strategy_for

    strategy = strategy_for(config.strategy)
    if not strategy.estimable:
        raise ValueError(f"estimate_memory does not know strategy {config.strategy!r} yet "
                         "(it traces single-device, data-parallel and sharded data-parallel steps)")
    strategy.check(world_size, config.global_batch, config.micro_batches)
    batch = config.global_batch // world_size if strategy.shards_batch else config.global_batch
    traced = _traced_step_peak(config, batch, world_size)
    at_peak = {c: int(traced["at_peak"][c]) for c in CATEGORIES}
    extras = {}
    if config.strategy in ("ddp", "zero1"):  # DDP allocates its buckets even on one rank
        extras["ddp_buckets"] = _ddp_bucket_bytes(config)
        at_peak["other"] += extras["ddp_buckets"]
    return MemoryEstimate(config.strategy, world_size, batch, sum(at_peak.values()),
                          traced["peak_phase"], at_peak, extras=extras)

