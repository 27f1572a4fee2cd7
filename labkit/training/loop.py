"""The training loop every layout shares, run on each rank (``fn`` of ``cluster.run``).

Per run (resolved before any rank started: ``labkit/training/run.py``): the layout's mesh,
this rank's model built in the fixed order (``labkit/training/build``), observers for what
the layout measures besides the step. Per step: this rank's slice of the
batch, the step (without a pipeline, ``training/step/spmd.py``; through one,
``parallel/pipeline/schedule.py``) under the collective meter, and one ``StepRecord``.

An observer has three calls, all outside the step's timing and its meter:
``on_build(run, built, config)``, ``after_backward(run, built)`` and
``after_step(run, built, step, meter) -> dict`` (measurements added to the record).
"""

from __future__ import annotations

import gc
import math
from contextlib import ExitStack, nullcontext

from labkit.models import local_slice, loss_fn, make_batch, to_device
from labkit.parallel.context.apply import shard_batch
from labkit.parallel.context.engine import LABELS, torch_context_parallel
from labkit.parallel.embedding.observe import TableObserver
from labkit.parallel.expert.observe import ExpertObserver
from labkit.parallel.pipeline.schedule import pipeline_step
from labkit.runtime.comm.intercept import CollectiveMeter
from labkit.runtime.comm.meter import CommMeter, union_seconds
from labkit.runtime.memory.capacity import on_host
from labkit.runtime.memory.tracker import relabel_live
from labkit.training.build import ParallelContext, build, full_weights, parallel_context
from labkit.training.checkpoint.session import Checkpointer
from labkit.training.profile import rank_profiler
from labkit.training.run import Run
from labkit.training.runqueue import RunQueueObserver
from labkit.training.step.record import StepRecord
from labkit.training.step.spmd import micro_steps, run_step, step_precision

# Steps 0 and 1 hold the peak of every later step (step 0 creates the optimizer state,
# step 1 runs with it; DDP rebuilds its buckets in step 1): memory is tracked there, and
# later steps run untracked so that their timings are those of plain PyTorch.
MEMORY_STEPS = 2


def _exposed_comm(built, timing: dict, meter: CommMeter) -> float:
    """Communication time not hidden behind computation.

    Without overlap every moment inside a collective is a moment the step waits (on a CPU
    rank, one core, collectives and compute take turns). With DDP's overlap only the tail
    of backward, after the last bucket was ready, is waiting; anything issued after backward
    (ZeRO-1's parameter broadcasts) is waited for in full.
    """
    if not built.overlaps_comm:
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


def _record(built, timing: dict, meter: CommMeter, tracked: bool) -> StepRecord:
    if built.pipeline is not None:
        return StepRecord(timing["loss"], timing["step_s"], timing["forward_s"],
                          timing["backward_s"], timing["optimizer_s"], timing["comm_s"],
                          timing["compute_s"], meter.busy_s, meter.stats, tracked,
                          timing["timeline"])
    exposed = _exposed_comm(built, timing, meter)
    return StepRecord(timing["loss"].item(), timing["step_s"], timing["forward_s"],
                      timing["backward_s"], timing["optimizer_s"], exposed,
                      timing["step_s"] - exposed, meter.busy_s, meter.stats, tracked)


def _one_step(run: ParallelContext, config, built, observers, step: int,
              tracked: bool) -> StepRecord:
    torch_cp = run.engines.cp_engine == "torch"
    with on_host():  # making data is the host's job; the device holds its own copy
        batch = make_batch(config.model, step, config.global_batch, config.seed)
        batch = local_slice(batch, run.data_rank, run.layout.data_size)
        if not torch_cp:  # labkit's ring: its tokens; torch's engine shards them itself
            batch = shard_batch(batch, run.coordinate("cp"), run.layout.cp)
    batch = to_device(batch, run.device, copy=True)

    def sync_gradients() -> None:  # the build's steps, then what the observers look at
        built.sync_gradients()
        for observer in observers:
            observer.after_backward(run, built)

    meter = CommMeter(run.clock, run.labels)
    run.clock.start()
    cp_step = torch_context_parallel(run.submesh("cp"), batch) if torch_cp else nullcontext()
    with CollectiveMeter(meter), cp_step:  # the meter settles on leaving: all traffic in
        if built.pipeline is not None:
            timing = pipeline_step(built.pipeline, batch, built.optimizer, run.clock,
                                   sync_gradients)
        else:
            timing = run_step(built.model, batch, loss_fn(config.model), built.optimizer,
                              step_precision(config, built), sync_gradients, run.clock,
                              micro_steps(config), built.no_sync)
    del batch
    record = _record(built, timing, meter, tracked)
    for observer in observers:
        record.extras.update(observer.after_step(run, built, step, meter))
    # rank 0's loss (of its slice of the batch) in the live progress text; a pipeline's rank 0
    # is its first stage, which computes no loss (nan): then the text shows none
    shown = run.rank == 0 and record.loss is not None and not math.isnan(record.loss)
    loss = f", rank 0 loss {record.loss:.6g}" if shown else ""
    run.report(step + 1, config.steps, f"{config.label} x{run.world_size}{loss}")
    return record


def _steps(run, config, built, observers, steps: range, tracked: bool, records: list,
           saver, profiler) -> None:
    """Run ``steps``, appending their records; save a checkpoint after those due; tell the
    profiler (``profile.py``) each step is done."""
    for step in steps:
        records.append(_one_step(run, config, built, observers, step, tracked))
        profiler.step()  # before the checkpoint: a save is not part of the step
        if saver is not None and saver.due(step + 1):
            saver.save(step + 1, records)


def _observers(resolved: Run) -> list:
    observers = [TableObserver()] if resolved.engines.tables is not None else []
    if resolved.config.model.name == "moe_gpt":  # expert load and dropped tokens, per step
        observers.append(ExpertObserver())
    return observers + [RunQueueObserver()]  # the load each step ran under (plan/checkrun)


def train_on_rank(ctx, run_dict: dict) -> dict:
    """Train the run ``run_dict`` describes (``Run.to_dict``: resolved and checked before any
    rank started) on this rank; return its records, memory and (if asked) weights."""
    resolved = Run.from_dict(run_dict)
    config = resolved.config
    gc.collect()  # what earlier runs left in reference cycles would still hold device memory
    run = parallel_context(ctx, resolved)
    observers = _observers(resolved)
    always_tracked = ctx.memory.capacity_bytes is not None  # a cap tracks the whole job
    with ExitStack() as profiling:  # the profiler spans the tracked and the untracked steps
        with ctx.memory as tracker:
            tracker.reset_peak()
            with tracker.label_as("parameters"):  # a cap too small for the weights says so
                built = build(run)
            relabel_live(tracker, "parameters")  # the real weights are filed again below
            saver = Checkpointer(run, built, config) if config.checkpoint_dir else None
            start, records = saver.resume() if saver else (0, [])  # (steps done, records)
            tracker.track_external(*built.modules, built.optimizer)  # loaded state included
            relabel_live(tracker)  # what set-up made besides weights (e.g. DDP's buckets)
            for observer in observers:
                observer.on_build(run, built, config)
            tracked_until = min(config.steps, start + MEMORY_STEPS)
            profiler = profiling.enter_context(rank_profiler(
                config.profile, ctx.rank, resolved.device_type, start, config.steps,
                config.steps if always_tracked else tracked_until,  # as the report times
                world_size=ctx.world_size))
            _steps(run, config, built, observers, range(start, tracked_until), True,
                   records, saver, profiler)
            memory = tracker.report()
        _steps(run, config, built, observers, range(tracked_until, config.steps),
               always_tracked, records, saver, profiler)
    if saver is not None:
        saver.close()
    out = {"rank": ctx.rank, "records": [r.to_dict() for r in records], "memory": memory}
    if saver is not None:
        out["resumed_at"], out["resumed_from"] = start, saver.resumed_from
    if run.engines.cp_engine is not None:  # which engine ran cp (the report's extra)
        out["cp_engine"] = LABELS[run.engines.cp_engine]
    if config.profile is not None and start < config.steps:
        out["trace"] = profiler.path
    if config.return_weights:
        out["weights"] = full_weights(built.parts, built.names, config, run.layout.tp)
    return out
