"""The training loop every strategy shares, run on each rank (``fn`` of ``cluster.run``)."""

from __future__ import annotations

import gc

import torch

from labkit.comm.meter import CommMeter
from labkit.memory.capacity import on_host
from labkit.memory.tracker import relabel_live
from labkit.models import loss_fn, make_batch, to_device
from labkit.train.config import TrainConfig
from labkit.train.step import make_optimizer, run_step
from labkit.train.strategy import local_slice, strategy_for


def _exposed_comm(strategy, timing: dict, meter: CommMeter) -> float:
    """Communication time not hidden behind computation."""
    if not strategy.overlaps_comm:
        return meter.busy_s
    if not meter.intervals:
        return 0.0
    # Overlapped (DDP): once the last bucket is ready, backward has no compute left, so the
    # rest of backward is spent waiting for AllReduce.
    last_ready = max(start for start, _ in meter.intervals)
    return min(timing["backward_s"], max(0.0, timing["backward_end"] - last_ready))


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
            "comm_bytes": meter.bytes, "comm_calls": meter.calls,
            "memory_tracked": ctx.memory._depth > 0}


def _own_step_record(own: dict, ctx) -> dict:
    """A pipeline's step: busy time from its timeline is computation, the rest waiting."""
    events = own["timeline"]
    spent = {kind: sum(e["end"] - e["start"] for e in events if e["kind"] == kind)
             for kind in ("F", "B")}
    return {"loss": own["loss"], "step_s": own["step_s"], "forward_s": spent["F"],
            "backward_s": spent["B"], "optimizer_s": own["optimizer_s"],
            "comm_s": own["waiting_s"], "compute_s": own["step_s"] - own["waiting_s"],
            "comm_busy_s": own["waiting_s"], "comm_bytes": 0, "comm_calls": 0,
            "timeline": events, "memory_tracked": ctx.memory._depth > 0}


def train_on_rank(ctx, config_dict: dict) -> dict:
    """Train ``config`` on this rank; return its losses, phase times, traffic and memory."""
    config = TrainConfig.from_dict(config_dict)
    strategy = strategy_for(config.strategy)
    meter = CommMeter()
    gc.collect()  # what earlier runs left in reference cycles would still hold device memory
    with ctx.memory as tracker:
        tracker.reset_peak()
        model = strategy.wrap(ctx, strategy.build(ctx, config), meter, config)
        optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
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
        out["weights"] = {k: v.detach().cpu().clone() for k, v in inner.state_dict().items()}
    return out
