"""Notebook 03's second exercise: PyTorch's own pipeline, wired by the learner.

The learner writes ``pipeline_schedule(ctx, part, micro_batches, loss_fn, schedule_class)``:
each of two ranks holds ``part``, its half of an MLP, and returns a ``schedule_class``
(``ScheduleGPipe`` or ``Schedule1F1B``) over a ``torch.distributed.pipelining.PipelineStage``
built from it. The check runs it once with each class. It reads how the stage and the schedule
were wired (their class, stage index, number of stages, the loss on the last stage, the number
of micro-batches) before any rank steps, so that a miswired pipeline is named instead of
hanging; then rank 0 calls ``schedule.step(inputs)`` and rank 1 ``schedule.step(target=targets,
losses=losses)``, and the loss and each stage's gradients are compared here with one device's
on the whole batch.

What a pass rests on is outside the ranks. Each run draws its own weights and batch here
(``fresh_seed``) and sends each rank only what it holds in a pipeline (``PerRank``): rank 0
its stage's weights and the inputs, rank 1 its stage's weights and the targets, as tensors (a
seed is 8 bytes a rank could pass on; random tensors cannot be had in fewer bytes than they
hold). The one-device reference is computed here from both. So rank 1 cannot compute the loss
without rank 0's activations, nor rank 0 its gradients without rank 1's backward. And the
bytes that crossed each rank's TCP sockets are counted by the kernel (``SocketCount``, gloo):
each must have sent at least the micro-batches' activations (rank 0) or their gradients
(rank 1), and less than a stage's weights, which an answer that ships one stage to the other
rank and computes both there would send. In grading an uncounted run fails the exercise.

The wiring the ranks report (read from the schedule's private ``_stage``, ``_n_microbatches``,
``_loss_fn``, pinned by ``tests/test_checks_pipeline_mesh_dcp.py``) names honest mistakes; a
pass does not rest on it. Nor does it prove that torch's schedule did the work: a
hand-written pipeline (each activation and its gradient sent with ``dist.send``) returned
under a schedule's name passes too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from labkit.lessons.exercise import reports
from labkit.lessons.exercise.outside import SocketCount, framing_allowed, fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.memory import format_bytes

EXERCISE = "pipeline_schedule"
WHERE = "pipeline_schedule"
D_IN, D_HIDDEN, D_OUT, BATCH, MICRO_BATCHES = 16, 64, 4, 16, 4
KINDS = ("ScheduleGPipe", "Schedule1F1B")  # each schedule_class the check asks for
HANG_HINT = ("both ranks must build their stage and schedule the same way: stage_index "
             "ctx.rank of num_stages ctx.world_size, and the same number of micro-batches")
# The bytes between the stages: the micro-batches' activations forward (rank 0), their
# gradients back (rank 1), each (BATCH, D_HIDDEN) float32 in all. Besides, a rank's sockets
# carry the job's exchange of the wiring (all_gather_object), torch's metadata (shapes,
# dtypes, its warm-up vote) and gloo's framing of each message: about 2 KB measured (torch
# 2.13), OTHER_BYTES allowed. MOST_SENT stays below a stage's weights (about 17 KB at width
# 64: the reason for that width), which an answer that runs both stages on one rank ships.
BETWEEN_STAGES = BATCH * D_HIDDEN * 4
OTHER_BYTES = 4_096
MOST_SENT = (BETWEEN_STAGES + framing_allowed(4 * MICRO_BATCHES, 4 * MICRO_BATCHES)
             + OTHER_BYTES)


def _part(rank: int) -> nn.Sequential:
    """Stage ``rank``'s half of the MLP (Linear, ReLU, Linear, ReLU | Linear, ReLU, Linear)."""
    if rank == 0:
        return nn.Sequential(nn.Linear(D_IN, D_HIDDEN), nn.ReLU(),
                             nn.Linear(D_HIDDEN, D_HIDDEN), nn.ReLU())
    return nn.Sequential(nn.Linear(D_HIDDEN, D_HIDDEN), nn.ReLU(), nn.Linear(D_HIDDEN, D_OUT))


def _weights(rank: int, seed: int) -> list[torch.Tensor]:
    with torch.random.fork_rng(devices=[]):  # the checker's own generator left as it was
        torch.manual_seed(seed)
        return [p.detach() for p in _part(rank).parameters()]


def _loaded(rank: int, weights: list[torch.Tensor]) -> nn.Sequential:
    part = _part(rank)
    with torch.no_grad():
        for param, value in zip(part.parameters(), weights, strict=True):
            param.copy_(value)
    return part


class _Run:
    """One run's inputs, drawn here: each stage's weights, the inputs and the targets (CPU)."""

    def __init__(self):
        self.weights = [_weights(rank, fresh_seed()) for rank in (0, 1)]
        generator = torch.Generator().manual_seed(fresh_seed())
        self.inputs = torch.randn(BATCH, D_IN, generator=generator)
        self.targets = torch.randn(BATCH, D_OUT, generator=generator)

    def private(self) -> PerRank:
        """What each stage holds: its weights, and the inputs (rank 0) or targets (rank 1)."""
        return PerRank([(self.weights[0], self.inputs), (self.weights[1], self.targets)])

    def reference(self) -> tuple[float, list[list[torch.Tensor]]]:
        """One device's loss on the whole batch, and each stage's gradients."""
        parts = [_loaded(rank, self.weights[rank]) for rank in (0, 1)]
        loss = F.mse_loss(parts[1](parts[0](self.inputs)), self.targets)
        loss.backward()
        return loss.item(), [[p.grad for p in part.parameters()] for part in parts]


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


def _job(ctx, fn, kind: str, private) -> dict:
    import torch.distributed as dist
    from torch.distributed import pipelining

    weights, data = private  # data: the inputs on rank 0, the targets on rank 1
    part = _loaded(ctx.rank, weights).to(ctx.device)
    schedule = fn(ctx, part, MICRO_BATCHES, F.mse_loss, getattr(pipelining, kind))
    wiring = {**_wiring(ctx, schedule), "asked": kind}
    everyone = [None] * ctx.world_size
    dist.all_gather_object(everyone, wiring)  # step only if every rank is wired to: no hang
    if any(_wiring_problem(r, w) for r, w in enumerate(everyone)):
        return {"wiring": wiring}
    losses: list = []
    if ctx.rank == 0:
        schedule.step(data.to(ctx.device))
    else:
        schedule.step(target=data.to(ctx.device), losses=losses)
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


def _well_wired(w) -> bool:
    """Whether a rank's ``wiring`` has the shape ``_wiring`` gives it."""
    if not isinstance(w, dict) or type(w.get("asked")) is not str:
        return False
    if w.get("problem") is not None:
        return type(w["problem"]) is str
    return (type(w.get("schedule")) is str and type(w.get("loss_fn")) is bool
            and all(isinstance(w.get(k), int) for k in ("stage_index", "num_stages"))
            and isinstance(w.get("micro_batches"), (int, float, str, type(None))))


def _reported(values: list, shapes: list[list[tuple]]) -> CheckResult | None:
    """The verdict on a report ``_job`` does not write, None if every one is well formed."""
    for rank, v in enumerate(values):
        if not (isinstance(v, dict) and _well_wired(v.get("wiring"))):
            return reports.forged(EXERCISE, rank)
    for rank, v in enumerate(values):
        if "grads" in v and not reports.fields(v, {
                "grads": lambda g, s=shapes[rank]: reports.tensor_list(g, s, True,
                                                                     torch.float32),
                "losses": lambda x: isinstance(x, list) and all(type(i) is float for i in x)}):
            return reports.forged(EXERCISE, rank)
    return None


def _wire_problems(wire: SocketCount, on_wire: list[int] | None) -> list[str]:
    """The bytes the kernel counted on each rank's sockets beside what the pipeline sends:
    at least its activations (rank 0) or their gradients (rank 1), and less than a stage's
    weights (the least an answer that computes both stages on one rank must ship)."""
    if on_wire is None:
        return [wire.unmeasured()] if wire.required else []
    carried = ("the micro-batches' activations", "the gradients of those activations")
    problems = []
    for rank, sent in enumerate(on_wire):
        if sent < BETWEEN_STAGES:
            problems.append(
                f"{format_bytes(sent)} crossed rank {rank}'s sockets (the kernel's count), less "
                f"than {carried[rank]} ({format_bytes(BETWEEN_STAGES)}): the schedule's "
                "stages send them to each other; step the schedule you return")
        elif sent > MOST_SENT:
            problems.append(
                f"{format_bytes(sent)} crossed rank {rank}'s sockets (the kernel's count), more "
                f"than a pipeline sends ({carried[rank]}, {format_bytes(BETWEEN_STAGES)}, and "
                f"at most {format_bytes(MOST_SENT - BETWEEN_STAGES)} besides): a stage sends its "
                "activations or their gradients, never its weights or its batch")
    return problems


def _judge(values: list[dict], run: _Run) -> CheckResult:
    full_loss, ref_grads = run.reference()
    if forged := _reported(values, [[tuple(g.shape) for g in grads] for grads in ref_grads]):
        return forged
    # the last stage first: its loss_fn is the one a learner forgets most
    problems = [p for r, v in reversed(list(enumerate(values)))
                if (p := _wiring_problem(r, v["wiring"]))]
    if problems:
        return failed(EXERCISE, problems[0], problems[1:])
    if any("grads" not in v for v in values):
        return reports.forged(EXERCISE, next(r for r, v in enumerate(values)
                                             if "grads" not in v))
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
    if not abs(loss - full_loss) <= 1e-5 * max(1.0, abs(full_loss)):  # a NaN loss is wrong too
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
    socket_bytes = {}
    for kind in KINDS:  # each a run of its own, on weights and a batch of its own
        run, wire = _Run(), SocketCount(cluster)
        outcome = run_checked(cluster, EXERCISE, WHERE, _job, fn, kind, run.private(),
                              timeout=timeout, hang_hint=HANG_HINT)
        on_wire = wire.sent()
        verdict = outcome.verdict or _judge(outcome.values, run)
        socket_bytes[kind] = on_wire
        if verdict.passed and (problems := _wire_problems(wire, on_wire)):
            verdict = failed(EXERCISE, problems[0], problems[1:], socket_bytes=on_wire,
                             between_stages=BETWEEN_STAGES)
        if not verdict.passed:
            return verdict
    return passed(EXERCISE, f"{' and '.join(KINDS)} over 2 PipelineStages with "
                  f"{MICRO_BATCHES} micro-batches: the loss and both stages' gradients equal "
                  "one device's on the whole batch", schedules=list(KINDS),
                  socket_bytes=socket_bytes, between_stages=BETWEEN_STAGES)
