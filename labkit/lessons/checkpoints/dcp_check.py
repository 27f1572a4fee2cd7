"""Notebook 10's second exercise: save and resume with DCP, written by the learner.

The learner writes ``save_checkpoint(model, optimizer, step, folder)`` and
``load_checkpoint(model, optimizer, folder)`` (which returns the step): the model's and
Adam's state through ``get_state_dict``, written with ``torch.distributed.checkpoint.save``,
read back with ``load`` and put into the model and optimizer with ``set_state_dict``. On
every rank the check trains a small MLP (float64) under DDP, each rank on its own slice of
batches drawn for each run, calls ``save_checkpoint`` after two steps into a folder the check
chose, trains on (the uninterrupted run), then builds a fresh model and optimizer with other
weights, calls ``load_checkpoint`` and trains from the step it returned. Nothing is killed:
the resumed losses must equal the uninterrupted ones bit for bit, and what the ranks report
(the weights and Adam's state back, or not) names what was lost.

A pass rests on what the check measures outside the ranks, as ``check.py``'s does: the
uninterrupted losses are one device's, computed in the check's process; the checkpoint
``save_checkpoint`` wrote, read by the check itself (``read.py``), holds one device's weights
and Adam moments at the saved step; and ``load_checkpoint`` of a checkpoint the check wrote
(the same entries, another run's state at another step) returns that step and trains on as
one device does from that state. Save and load functions that keep the state in the rank's
memory beside (or instead of) the folder fail.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from labkit.lessons.checkpoints.check import (
    REWIRED,
    _fresh,
    _restored,
    _train,
    judge_own,
    save_then_resume,
    uninterrupted_problem,
)
from labkit.lessons.checkpoints.read import METADATA_FILE, Unreadable, read_checkpoint
from labkit.lessons.checkpoints.reference import (
    BATCH,
    DTYPE,
    RESUMED_AT,
    SAVED_AT,
    STEPS,
    fmt,
    match,
    missing,
)
from labkit.lessons.exercise.result import CheckResult, failed, passed

EXERCISE = "dcp_resume"
WHERE = "save_checkpoint / load_checkpoint"
NO_CHECKPOINT = ("save_checkpoint wrote no DCP checkpoint in the folder: call "
                 "torch.distributed.checkpoint.save(state, checkpoint_id=folder)")


def _adam_state(optimizer) -> list[torch.Tensor]:
    """Adam's moments and step counts, in parameter order (empty before its first step)."""
    return [t.detach().clone() for group in optimizer.param_groups for p in group["params"]
            for t in optimizer.state.get(p, {}).values() if isinstance(t, torch.Tensor)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _as_step(step):
    return step.item() if isinstance(step, torch.Tensor) and step.numel() == 1 else step


def _job(ctx, save, load, seed: int, other_seed: int, batches, folder: str) -> dict:
    model, optimizer = _fresh(ctx, seed, DTYPE)
    _train(ctx, model, optimizer, range(SAVED_AT), batches)
    weights, moments = [p.detach().clone() for p in model.parameters()], _adam_state(
        optimizer)
    save(model, optimizer, SAVED_AT, folder)
    dist.barrier()
    if not os.path.exists(os.path.join(folder, METADATA_FILE)):
        return {"written": False}  # nothing to load: the check reads the folder and says so
    uninterrupted = _train(ctx, model, optimizer, range(SAVED_AT, STEPS), batches)
    model, optimizer = _fresh(ctx, other_seed, DTYPE)  # other weights, no optimizer state
    step = _as_step(load(model, optimizer, folder))
    found = {"weights_back": _same([p.detach() for p in model.parameters()], weights),
             "moments_back": _same(_adam_state(optimizer), moments)}
    resumed = (_train(ctx, model, optimizer, range(step, STEPS), batches)
               if type(step) is int and 0 <= step <= STEPS else [])
    return {"uninterrupted": uninterrupted, "resumed": resumed, "step": step, **found}


def _resume_job(ctx, load, other_seed: int, batches, folder: str) -> dict:
    """``load`` the check's own checkpoint into a fresh model, and train on from it."""
    model, optimizer = _fresh(ctx, other_seed, DTYPE)
    return _restored(ctx, model, optimizer, _as_step(load(model, optimizer, folder)), batches)


def _well_formed(r) -> bool:
    """Whether a rank's report has the shape ``_job`` gives it (a rank's code may change it)."""
    def floats(value):
        return isinstance(value, list) and all(type(x) is float for x in value)
    return (isinstance(r, dict) and floats(r.get("uninterrupted")) and floats(r.get("resumed"))
            and type(r.get("weights_back")) is bool and type(r.get("moments_back")) is bool
            and "step" in r)


def _read(folder: str):
    """The checkpoint ``save_checkpoint`` wrote, read here, or the verdict."""
    if not os.path.lexists(os.path.join(folder, METADATA_FILE)):
        return failed(EXERCISE, NO_CHECKPOINT)
    try:
        return read_checkpoint(folder)
    except Unreadable as why:
        return failed(EXERCISE, f"the check could not read the checkpoint save_checkpoint "
                      f"wrote: {why}")


def _judge(values: list[dict], ref: dict, saved):
    """The first run's reports beside one device's (``ref``) and the checkpoint read here:
    (the checkpoint, which entry is which), or the verdict."""
    if isinstance(saved, CheckResult):
        return saved
    if not all(_well_formed(v) for v in values):
        return failed(EXERCISE, REWIRED)
    r, state = values[0], ref["states"][SAVED_AT]
    if problem := uninterrupted_problem(values, ref, EXERCISE):
        return problem
    losses = (f"its losses {fmt(r['resumed'])} differ from the uninterrupted run's "
              f"{fmt(r['uninterrupted'])}")
    if not all(v["weights_back"] for v in values):
        return failed(EXERCISE, "load_checkpoint did not put the weights back: the fresh "
                      "model still has its own. dcp.load fills, in place, only the state dict "
                      "it is given: load into get_state_dict(model, optimizer) of the fresh "
                      "model, then set_state_dict(model, optimizer, model_state_dict=..., "
                      "optim_state_dict=...)")
    found = match(saved, state)
    lost = missing(found, state)
    if "moments" in lost and not any("exp_avg" in key for key in saved.tensors):
        return failed(EXERCISE, "the checkpoint holds no optimizer state, so the resumed run "
                      f"restarts Adam from zero moments: {losses}",
                      ["save the optimizer's state beside the model's: get_state_dict(model, "
                       "optimizer) gives both"])
    if not all(v["moments_back"] for v in values):
        return failed(EXERCISE, "the checkpoint holds Adam's state but load_checkpoint did "
                      f"not put it into the fresh optimizer, so Adam restarts: {losses}",
                      ["optimizer.state_dict() of a fresh Adam has no state for dcp.load to "
                       "fill: load into get_state_dict(model, optimizer), then "
                       "set_state_dict(...)"])
    if type(r["step"]) is not int or r["step"] != SAVED_AT:
        return failed(EXERCISE, f"load_checkpoint returned step {r['step']!r} "
                      f"({type(r['step']).__name__}), the checkpoint "
                      f"was saved at step {SAVED_AT}: save the step in the checkpoint and "
                      "return it, so that the run resumes at the right batch")
    if not all(v["resumed"] == v["uninterrupted"] for v in values):
        return failed(EXERCISE, f"the resumed losses {fmt(r['resumed'])} differ from the "
                      f"uninterrupted run's {fmt(r['uninterrupted'])}")
    if lost:
        what = " and ".join(sorted(lost)).replace("moments", "Adam moments")
        return failed(EXERCISE, f"the checkpoint save_checkpoint wrote does not hold the "
                      f"{what} of step {SAVED_AT} (the check read the folder itself, outside "
                      "the ranks), yet the fresh model and optimizer got them back: they must "
                      "travel in the checkpoint, not stay in the rank's memory",
                      ["save get_state_dict(model, optimizer) and the step with dcp.save"])
    return saved, found


def dcp_resume(cluster, save, load, timeout: float | None = None) -> CheckResult:
    """Train, ``save`` at a step, resume with ``load`` on fresh weights, compare the losses;
    then resume with ``load`` from a checkpoint of the check's own."""
    n = cluster.world_size
    if BATCH % n:
        return failed(EXERCISE, f"the check splits a batch of {BATCH} over the ranks; "
                      f"{n} ranks do not divide it: resize the cluster to 1, 2, 4 or 8")
    verdict, r = save_then_resume(
        cluster, EXERCISE, WHERE, _job, _resume_job, (save, load), (load,),
        lambda values, ref, folder: _judge(values, ref, _read(folder)),
        lambda values, own: judge_own(
            values, own, EXERCISE, "load_checkpoint returned",
            ("load_checkpoint returns the step and puts into the model and optimizer what "
             "dcp.load read from the folder it is given (set_state_dict)",)), timeout)
    return verdict or passed(
        EXERCISE, f"saved at step {SAVED_AT}, resumed on fresh weights on {n} ranks: the "
        f"losses of steps {SAVED_AT}-{STEPS - 1} equal the uninterrupted run's bit for bit",
        ["and one device's, computed by the check outside the ranks; the checkpoint holds "
         "one device's weights and Adam moments, and a resume from the check's own "
         f"checkpoint (another state, at step {RESUMED_AT}) trains on as one device does"],
        uninterrupted=r["uninterrupted"], resumed=r["resumed"])
