"""Notebook 10's second exercise: save and resume with DCP, written by the learner.

The learner writes ``save_checkpoint(model, optimizer, step, folder)`` and
``load_checkpoint(model, optimizer, folder)`` (which returns the step): the model's and
Adam's state through ``get_state_dict``, written with ``torch.distributed.checkpoint.save``,
read back with ``load`` and put into the model and optimizer with ``set_state_dict``. On
every rank the check trains a small MLP under DDP from a seed drawn for each run, calls
``save_checkpoint`` after two steps, trains on (the uninterrupted run), then builds a fresh
model and optimizer with other weights, calls ``load_checkpoint`` and trains from the step it
returned. Nothing is killed: the resumed losses must equal the uninterrupted ones bit for bit.
"""

from __future__ import annotations

import shutil
import tempfile

import torch
import torch.distributed as dist

from labkit.lessons.checkpoints.check import BATCH, SAVED_AT, STEPS, _fmt, _fresh, _train
from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked

EXERCISE = "dcp_resume"
WHERE = "save_checkpoint / load_checkpoint"


def _adam_state(optimizer) -> list[torch.Tensor]:
    """Adam's moments and step counts, in parameter order (empty before its first step)."""
    return [t.detach().clone() for group in optimizer.param_groups for p in group["params"]
            for t in optimizer.state.get(p, {}).values() if isinstance(t, torch.Tensor)]


def _same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def _job(ctx, save, load, seed: int) -> dict:
    folder = [tempfile.mkdtemp(prefix="labkit-check-") if ctx.rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    try:
        model, optimizer = _fresh(ctx, seed=seed)
        _train(ctx, model, optimizer, range(SAVED_AT))
        weights, moments = [p.detach().clone() for p in model.parameters()], _adam_state(
            optimizer)
        save(model, optimizer, SAVED_AT, folder[0])
        dist.barrier()
        saved = _saved_keys(folder[0])  # the same folder, the same answer on every rank
        if not saved["readable"]:
            return {"saved": saved}
        uninterrupted = _train(ctx, model, optimizer, range(SAVED_AT, STEPS))
        model, optimizer = _fresh(ctx, seed=seed + 1)  # other weights, no optimizer state
        step = load(model, optimizer, folder[0])
        found = {"weights_back": _same([p.detach() for p in model.parameters()], weights),
                 "moments_back": _same(_adam_state(optimizer), moments)}
        if isinstance(step, torch.Tensor) and step.numel() == 1:
            step = step.item()
        resumed = (_train(ctx, model, optimizer, range(step, STEPS))
                   if type(step) is int and 0 <= step <= STEPS else [])
    finally:
        dist.barrier()
        if ctx.rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    return {"uninterrupted": uninterrupted, "resumed": resumed, "step": step, "saved": saved,
            **found}


def _saved_keys(folder: str) -> dict:
    """What the checkpoint in ``folder`` holds: Adam's moments, weights (by DCP's keys)."""
    import torch.distributed.checkpoint as dcp

    try:
        keys = list(dcp.FileSystemReader(folder).read_metadata().state_dict_metadata)
    except Exception:  # noqa: BLE001 - nothing readable was saved: the judge says so
        return {"readable": False, "adam": False}
    return {"readable": True, "adam": any("exp_avg" in k for k in keys)}


def _judge(values: list[dict]) -> CheckResult:
    r = values[0]
    if not r["saved"]["readable"]:
        return failed(EXERCISE, "save_checkpoint wrote no DCP checkpoint in the folder: call "
                      "torch.distributed.checkpoint.save(state, checkpoint_id=folder)")
    losses = (f"its losses {_fmt(r['resumed'])} differ from the uninterrupted run's "
              f"{_fmt(r['uninterrupted'])}")
    if not all(v["weights_back"] for v in values):
        return failed(EXERCISE, "load_checkpoint did not put the weights back: the fresh "
                      "model still has its own. dcp.load fills, in place, only the state dict "
                      "it is given: load into get_state_dict(model, optimizer) of the fresh "
                      "model, then set_state_dict(model, optimizer, model_state_dict=..., "
                      "optim_state_dict=...)")
    if not r["saved"]["adam"]:
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
    if r["resumed"] != r["uninterrupted"]:
        return failed(EXERCISE, f"the resumed losses {_fmt(r['resumed'])} differ from the "
                      f"uninterrupted run's {_fmt(r['uninterrupted'])}")
    return passed(EXERCISE, f"saved at step {SAVED_AT}, resumed on fresh weights on "
                  f"{len(values)} ranks: the losses of steps {SAVED_AT}-{STEPS - 1} equal "
                  "the uninterrupted run's bit for bit",
                  uninterrupted=r["uninterrupted"], resumed=r["resumed"])


def dcp_resume(cluster, save, load, timeout: float | None = None) -> CheckResult:
    """Train, ``save`` at a step, resume with ``load`` on fresh weights, compare the losses."""
    n = cluster.world_size
    if BATCH % n:
        return failed(EXERCISE, f"the check splits a batch of {BATCH} over the ranks; "
                      f"{n} ranks do not divide it: resize the cluster to 1, 2, 4 or 8")
    outcome = run_checked(cluster, EXERCISE, WHERE, _job, save, load, fresh_seed(),
                          timeout=timeout)
    return outcome.verdict or _judge(outcome.values)
