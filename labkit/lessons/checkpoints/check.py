"""Notebook 10's exercise: what a checkpoint must hold for a run to resume exactly.

The learner writes ``TrainingState(model, optimizer, step)``, a DCP ``Stateful`` with
``state_dict()`` and ``load_state_dict(state_dict)``. On every rank the check trains a small
MLP under DDP for two steps, saves ``{"train": TrainingState(...)}`` with ``dcp.save``, trains
two more (the uninterrupted run), then builds a fresh model and optimizer with other weights,
loads the checkpoint into a new ``TrainingState`` and trains from the step it restored. The
resumed losses must equal the uninterrupted ones bit for bit; if not, the check says what was
not restored: the step (the data position), the weights, or Adam's moments.
"""

from __future__ import annotations

import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.models import MLPConfig, build_model, loss_fn, make_batch

EXERCISE = "training_state"
WHERE = "TrainingState"
MODEL = MLPConfig(d_in=16, d_hidden=32, n_layers=3, d_out=4)
BATCH, SAVED_AT, STEPS, LR = 16, 2, 4, 1e-2


def _train(ctx, model, optimizer, steps) -> list[float]:
    """Steps ``steps`` on this rank's slice of each step's batch; the whole-batch losses."""
    share = BATCH // ctx.world_size
    mine = slice(ctx.rank * share, (ctx.rank + 1) * share)
    losses = []
    for step in steps:
        inputs, targets = (t.to(ctx.device) for t in make_batch(MODEL, step, BATCH))
        loss = loss_fn(MODEL)(model(inputs[mine]), targets[mine])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        whole = loss.detach().clone()
        dist.all_reduce(whole)
        losses.append(whole.item() / ctx.world_size)
    return losses


def _fresh(ctx, seed: int):
    torch.manual_seed(seed)
    model = DistributedDataParallel(build_model(MODEL, ctx.device))
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def _job(ctx, state_class) -> dict:
    folder = [tempfile.mkdtemp(prefix="labkit-check-") if ctx.rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    try:
        model, optimizer = _fresh(ctx, seed=0)
        _train(ctx, model, optimizer, range(SAVED_AT))
        saved_weights = [p.detach().clone() for p in model.parameters()]
        dcp.save({"train": state_class(model, optimizer, SAVED_AT)}, checkpoint_id=folder[0])
        uninterrupted = _train(ctx, model, optimizer, range(SAVED_AT, STEPS))
        model, optimizer = _fresh(ctx, seed=1)  # other weights, no optimizer state
        restored = state_class(model, optimizer, 0)
        dcp.load({"train": restored}, checkpoint_id=folder[0])
        weights_back = all(torch.equal(p, s) for p, s in zip(model.parameters(),
                                                             saved_weights, strict=True))
        moments_back = bool(optimizer.state)
        step = _whole(restored.step)
        resumed = _train(ctx, model, optimizer, range(step, STEPS)) if isinstance(
            step, int) and 0 <= step <= STEPS else []
    finally:
        dist.barrier()
        if ctx.rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    return {"uninterrupted": uninterrupted, "resumed": resumed, "step": step,
            "weights_back": weights_back, "moments_back": moments_back}


def _whole(step):
    """The step as an int: a 0-d integer tensor (torchtitan saves its step so) counts as
    its value; anything else is returned as it is, for the judge to name."""
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
        return int(step.item())
    return step


def _judge(values: list[dict]) -> CheckResult:
    r = values[0]
    if not isinstance(r["step"], int) or isinstance(r["step"], bool):
        return failed(EXERCISE, f"the step came back as {r['step']!r} "
                      f"({type(r['step']).__name__}), not a whole number: the resumed run "
                      "cannot start from it",
                      ["save the step as an int (or a 0-d integer tensor) and put back an "
                       "int: self.step = state_dict['step'] (.item() for a tensor)"])
    if r["step"] != SAVED_AT:
        return failed(EXERCISE, f"the step was not restored: saved at step {SAVED_AT}, the "
                      f"loaded TrainingState says step {r['step']!r}. The step is the data "
                      "position: a resumed run would repeat or skip batches.",
                      ["put the step in state_dict() and set self.step in load_state_dict()"])
    if not all(v["weights_back"] for v in values):
        return failed(EXERCISE, "the model's weights were not restored: after dcp.load the "
                      "fresh model still has its own weights",
                      ["state_dict() must return the model's state (get_state_dict), and "
                       "load_state_dict() must load it into the model (set_state_dict)"])
    if not all(v["moments_back"] for v in values) or r["resumed"] != r["uninterrupted"]:
        return failed(EXERCISE, "the weights came back but Adam's state did not: the resumed "
                      f"losses {_fmt(r['resumed'])} differ from the uninterrupted run's "
                      f"{_fmt(r['uninterrupted'])}",
                      ["Adam keeps two moments per parameter and a step count: save and load "
                       "the optimizer's state too (get_state_dict / set_state_dict)"])
    return passed(EXERCISE, f"resumed at step {SAVED_AT} on {len(values)} ranks, the losses "
                  f"of steps {SAVED_AT}-{STEPS - 1} equal the uninterrupted run's bit for bit",
                  uninterrupted=r["uninterrupted"], resumed=r["resumed"])


def _fmt(losses) -> str:
    return "[" + ", ".join(f"{x:.6f}" for x in losses) + "]"


def training_state(cluster, state_class, timeout: float | None = None) -> CheckResult:
    """Save with ``state_class``, resume with it on fresh weights, compare the losses."""
    n = cluster.world_size
    if BATCH % n:
        return failed(EXERCISE, f"the check splits a batch of {BATCH} over the ranks; "
                      f"{n} ranks do not divide it: resize the cluster to 1, 2, 4 or 8")
    outcome = run_checked(cluster, EXERCISE, WHERE, _job, state_class, timeout=timeout)
    return outcome.verdict or _judge(outcome.values)
