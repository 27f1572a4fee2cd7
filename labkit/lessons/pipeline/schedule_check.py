"""Notebook 03's second exercise: PyTorch's own pipeline, wired by the learner.

The learner writes ``pipeline_schedule(ctx, part, micro_batches, loss_fn, schedule_class)``:
each of two ranks holds ``part``, its half of an MLP, and returns a ``schedule_class``
(``ScheduleGPipe`` or ``Schedule1F1B``) over a ``torch.distributed.pipelining.PipelineStage``
built from it. The check runs it once with each class. It reads how the stage and the schedule
were wired (their class, stage index, number of stages, the loss on the last stage, the number
of micro-batches) before any rank steps, so that a miswired pipeline is named instead of
hanging; then rank 0 calls ``schedule.step(inputs)`` and rank 1 ``schedule.step(target=targets,
losses=losses)``, and the loss and each stage's gradients are compared here with one device's
on the whole batch, from a seed drawn for each run.

The schedule's stage and settings are read from its attributes (``_stage``, ``_n_microbatches``,
``_loss_fn``: private, pinned by ``tests/test_checks_pipeline_mesh_dcp.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked

EXERCISE = "pipeline_schedule"
WHERE = "pipeline_schedule"
D_IN, D_HIDDEN, D_OUT, BATCH, MICRO_BATCHES = 16, 32, 4, 16, 4
KINDS = ("ScheduleGPipe", "Schedule1F1B")  # each schedule_class the check asks for
HANG_HINT = ("both ranks must build their stage and schedule the same way: stage_index "
             "ctx.rank of num_stages ctx.world_size, and the same number of micro-batches")


def _model_and_batch(seed: int):
    """The whole MLP (Linear, ReLU, Linear, ReLU | Linear, ReLU, Linear), a batch and its
    targets, on the CPU, from ``seed``."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, D_HIDDEN),
                          nn.ReLU(), nn.Linear(D_HIDDEN, D_HIDDEN), nn.ReLU(),
                          nn.Linear(D_HIDDEN, D_OUT))
    return model, torch.randn(BATCH, D_IN), torch.randn(BATCH, D_OUT)


def _part(model: nn.Sequential, rank: int) -> nn.Sequential:
    half = 4  # the first two Linear+ReLU pairs on stage 0
    return model[:half] if rank == 0 else model[half:]


def _wiring(ctx, schedule) -> dict:
    """How this rank's schedule and stage were built (read, not run)."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle

    if not isinstance(schedule, PipelineScheduleSingle):
        return {"problem": f"rank {ctx.rank}'s pipeline_schedule returned "
                f"{type(schedule).__name__}, not a schedule: return ScheduleGPipe(stage, ...) "
                "or Schedule1F1B(stage, ...)"}
    stage = getattr(schedule, "_stage", None)
    if not isinstance(stage, PipelineStage):
        return {"problem": f"rank {ctx.rank}'s schedule is not built over a PipelineStage"}
    return {"problem": None, "schedule": type(schedule).__name__,
            "stage_index": stage.stage_index, "num_stages": stage.num_stages,
            "micro_batches": schedule._n_microbatches,
            "loss_fn": schedule._loss_fn is not None}


def _job(ctx, fn, seed: int, kind: str) -> dict:
    import torch.distributed as dist
    from torch.distributed import pipelining

    model, inputs, targets = _model_and_batch(seed)
    part = _part(model.to(ctx.device), ctx.rank)
    schedule = fn(ctx, part, MICRO_BATCHES, F.mse_loss, getattr(pipelining, kind))
    wiring = {**_wiring(ctx, schedule), "asked": kind}
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, wiring)  # step only if every rank is wired to: no hang
    if any(_wiring_problem(r, w) for r, w in enumerate(everyone)):
        return {"wiring": wiring}
    losses: list = []
    if ctx.rank == 0:
        schedule.step(inputs.to(ctx.device))
    else:
        schedule.step(target=targets.to(ctx.device), losses=losses)
    grads = [None if p.grad is None else p.grad.detach().cpu().clone()
             for p in part.parameters()]
    return {"wiring": wiring, "grads": grads,
            "losses": [float(loss.detach()) for loss in losses]}


def _wiring_problem(rank: int, w: dict) -> str | None:
    if w["problem"]:
        return w["problem"]
    if w["schedule"] != w["asked"]:
        return (f"rank {rank}'s pipeline_schedule returned a {w['schedule']} when it was given "
                f"schedule_class={w['asked']}: build the schedule_class it is given")
    if (w["stage_index"], w["num_stages"]) != (rank, 2):
        return (f"rank {rank}'s PipelineStage is stage_index {w['stage_index']} of num_stages "
                f"{w['num_stages']}: it is stage {rank} of 2 (stage_index=ctx.rank, "
                "num_stages=ctx.world_size)")
    if not w["loss_fn"]:
        where = "the last stage's" if rank == 1 else f"rank {rank}'s"
        return (f"{where} schedule has no loss_fn: the last stage computes the loss with it, "
                "and a schedule without one runs forward only (no backward), on any stage: "
                "pass loss_fn=loss_fn on every rank")
    n = w["micro_batches"]
    if n != MICRO_BATCHES:
        split = (f"{n} micro-batches do not divide the batch of {BATCH}" if
                 not isinstance(n, int) or n < 1 or BATCH % n else
                 f"the schedule splits the batch into {n} micro-batches")
        return (f"rank {rank}: {split}; the check asked for micro_batches={MICRO_BATCHES}: "
                "pass n_microbatches=micro_batches")
    return None


def _reference(seed: int) -> tuple[float, list]:
    model, inputs, targets = _model_and_batch(seed)
    loss = F.mse_loss(model(inputs), targets)
    loss.backward()
    return loss.item(), [[p.grad for p in _part(model, r).parameters()] for r in (0, 1)]


def _judge(values: list[dict], seed: int) -> CheckResult:
    # the last stage first: its loss_fn is the one a learner forgets most
    problems = [p for r, v in reversed(list(enumerate(values)))
                if (p := _wiring_problem(r, v["wiring"]))]
    if problems:
        return failed(EXERCISE, problems[0], problems[1:])
    full_loss, ref_grads = _reference(seed)
    losses = values[1]["losses"]
    if len(losses) != MICRO_BATCHES:
        return failed(EXERCISE, f"the last stage reported {len(losses)} losses, one per "
                      f"micro-batch ({MICRO_BATCHES}) expected")
    loss = sum(losses) / len(losses)
    for rank, v in enumerate(values):
        mine, ref = v["grads"], ref_grads[rank]
        if any(g is None for g in mine):
            return failed(EXERCISE, f"stage {rank}'s parameters got no gradient: build the "
                          "PipelineStage from the part you were given (not a copy)")
        if not all(torch.allclose(g, r, rtol=1e-4, atol=1e-6) for g, r in zip(mine, ref,
                                                                                strict=True)):
            return failed(EXERCISE, f"stage {rank}'s gradients differ from one device's on "
                          "the whole batch: keep the schedule's scale_grads=True (its loss is "
                          "a mean over each micro-batch)")
    if abs(loss - full_loss) > 1e-5 * max(1.0, abs(full_loss)):
        return failed(EXERCISE, f"the micro-batches' mean loss {loss:.6f} differs from one "
                      f"device's {full_loss:.6f}")
    kind = values[0]["wiring"]["schedule"]
    return passed(EXERCISE, f"{kind} over 2 PipelineStages with {MICRO_BATCHES} micro-batches: "
                  "the loss and both stages' gradients equal one device's on the whole batch",
                  loss=loss, full_loss=full_loss, schedule=kind)


def pipeline_schedule(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Build ``fn``'s schedule on each of 2 ranks, step it once, compare with one device."""
    if cluster.world_size != 2:
        return failed(EXERCISE, f"the exercise is a two-stage pipeline: check it on a 2-rank "
                      f"cluster (this one has {cluster.world_size})")
    for kind in KINDS:  # each a run of its own, from a seed of its own
        seed = fresh_seed()
        outcome = run_checked(cluster, EXERCISE, WHERE, _job, fn, seed, kind, timeout=timeout,
                              hang_hint=HANG_HINT)
        verdict = outcome.verdict or _judge(outcome.values, seed)
        if not verdict.passed:
            return verdict
    return passed(EXERCISE, f"{' and '.join(KINDS)} over 2 PipelineStages with "
                  f"{MICRO_BATCHES} micro-batches: the loss and both stages' gradients equal "
                  "one device's on the whole batch", schedules=list(KINDS))
