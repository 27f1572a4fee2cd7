"""The training loop every strategy shares, run on each rank (``fn`` of ``cluster.run``)."""

from __future__ import annotations

import contextlib
import gc

import torch
from torch.distributed.tensor import DTensor

from labkit.comm.intercept import CollectiveMeter
from labkit.comm.meter import CommMeter, union_seconds
from labkit.memory.capacity import on_host
from labkit.memory.tracker import relabel_live
from labkit.models import loss_fn, make_batch, to_device
from labkit.train.config import TrainConfig
from labkit.train.step import run_step
from labkit.train.strategy import local_slice, strategy_for


def _exposed_comm(strategy, timing: dict, meter: CommMeter) -> float:
    """Communication time not hidden behind computation.

    Without overlap every moment inside a collective is a moment the step waits (on a CPU
    rank, one core, collectives and compute take turns). With DDP's overlap only the tail
    of backward, after the last bucket was ready, is waiting; anything issued after backward
    (ZeRO-1's parameter broadcasts) is waited for in full.
    """
    if not strategy.overlaps_comm:
        return min(meter.union_s, timing["step_s"])
    end = timing["backward_end"]
    during = [start for start, _ in meter.intervals if start <= end]
    after = union_seconds([(s, e) for s, e in meter.intervals if s > end])
    if not during:
        return min(after, timing["step_s"])
    # Once the last bucket is ready, backward has no compute left: the rest of backward is
    # spent waiting for AllReduce.
    tail = min(timing["backward_s"], max(0.0, end - max(during)))
    return min(tail + after, timing["step_s"])


# Steps 0 and 1 hold the peak of every later step (step 0 creates the optimizer state,
# step 1 runs with it; DDP rebuilds its buckets in step 1): memory is tracked there, and
# later steps run untracked so that their timings are those of plain PyTorch.
MEMORY_STEPS = 2


def _one_step(ctx, config, strategy, model, optimizer, meter, step: int) -> dict:
    with on_host():  # making data is the host's job; the device holds its own copy
        batch = make_batch(config.model, step, config.global_batch, config.seed)
        if strategy.shards_batch:
            batch = local_slice(batch, ctx.rank, ctx.world_size)
    batch = to_device(batch, ctx.device, copy=True)
    meter.reset()
    synchronize = torch.cuda.synchronize if ctx.device.type == "cuda" else None
    own = strategy.step(ctx, model, batch, optimizer, config, synchronize)
    if own is not None:  # a strategy with a step of its own (pipelines)
        ctx.progress(step + 1, config.steps, f"{config.strategy} x{ctx.world_size}")
        return _own_step_record(own, ctx)
    with CollectiveMeter(meter) if strategy.counts_collectives else contextlib.nullcontext():
        timing = run_step(model, batch, loss_fn(config.model), optimizer, config.precision,
                          lambda: strategy.sync_gradients(ctx, model, meter), synchronize,
                          config.micro_batches, strategy.no_sync(model))
    del batch
    exposed = _exposed_comm(strategy, timing, meter)
    ctx.progress(step + 1, config.steps, f"{config.strategy} x{ctx.world_size}")
    return {"loss": timing["loss"].item(), "step_s": timing["step_s"],
            "forward_s": timing["forward_s"], "backward_s": timing["backward_s"],
            "optimizer_s": timing["optimizer_s"], "comm_s": exposed,
            "compute_s": timing["step_s"] - exposed, "comm_busy_s": meter.busy_s,
            "comm_bytes": meter.bytes, "comm_wire_bytes": meter.wire_bytes,
            "comm_calls": meter.calls,
            "comm_kinds": {kind: list(v) for kind, v in meter.by_kind.items()},
            "memory_tracked": ctx.memory._depth > 0, **strategy.step_extras(ctx, model)}


def _own_step_record(own: dict, ctx) -> dict:
    """A pipeline's step: busy time from its timeline is computation, the rest waiting."""
    events = own["timeline"]
    spent = {kind: sum(e["end"] - e["start"] for e in events if e["kind"] == kind)
             for kind in ("F", "B")}
    return {"loss": own["loss"], "step_s": own["step_s"], "forward_s": spent["F"],
            "backward_s": spent["B"], "optimizer_s": own["optimizer_s"],
            "comm_s": own["waiting_s"], "compute_s": own["step_s"] - own["waiting_s"],
            "comm_busy_s": own["waiting_s"], "comm_bytes": 0, "comm_calls": 0, "comm_kinds": {},
            "timeline": events, "memory_tracked": ctx.memory._depth > 0}


def _full(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor, gathered from all ranks if it is sharded (a DTensor)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def train_on_rank(ctx, config_dict: dict) -> dict:
    """Train ``config`` on this rank; return its losses, phase times, traffic and memory."""
    config = TrainConfig.from_dict(config_dict)
    strategy = strategy_for(config.strategy)
    meter = CommMeter()
    gc.collect()  # what earlier runs left in reference cycles would still hold device memory
    with ctx.memory as tracker:
        tracker.reset_peak()
        with tracker.label_as("parameters"):  # a cap too small for the weights says so
            built = strategy.build(ctx, config)
        model = strategy.wrap(ctx, built, meter, config)
        optimizer = strategy.make_optimizer(model, config)
        relabel_live(tracker, "parameters")  # the real weights are filed again just below
        tracker.track_external(model, optimizer)
        relabel_live(tracker)  # what set-up made besides weights (e.g. DDP's buckets): "other"
        records = [_one_step(ctx, config, strategy, model, optimizer, meter, step)
                   for step in range(min(config.steps, MEMORY_STEPS))]
        memory = tracker.report()
    records += [_one_step(ctx, config, strategy, model, optimizer, meter, step)
                for step in range(MEMORY_STEPS, config.steps)]
    out = {"rank": ctx.rank, "records": records, "memory": memory}
    if config.return_weights:
        inner = getattr(model, "module", model)  # DDP wraps the model
        with on_host():  # copies for the caller, not the training's memory (nor its cap)
            out["weights"] = {k: _full(v).detach().cpu().clone()
                              for k, v in inner.state_dict().items()}
    return out
