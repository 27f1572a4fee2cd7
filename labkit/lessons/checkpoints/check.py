"""Notebook 10's exercise: what a checkpoint must hold for a run to resume exactly.

The learner writes ``TrainingState(model, optimizer, step)``, a DCP ``Stateful`` with
``state_dict()`` and ``load_state_dict(state_dict)``. On every rank the check trains a small
MLP (in float64) under DDP for two steps, saves ``{"train": TrainingState(...)}`` with
``dcp.save`` into a folder the check chose, trains two more (the uninterrupted run), then
builds a fresh model and optimizer with other weights, loads the checkpoint into a new
``TrainingState`` and trains from the step it restored. The weights, the data and the fresh
model's other weights come from seeds drawn for each run, each rank receiving only its own
slice of each batch. The ranks return what was restored (the step, the weights, Adam's
moments) and the losses; the resumed losses must equal the uninterrupted ones bit for bit,
and if not, the check says what was not restored: the step (the data position), the weights,
or Adam's moments.

What a pass rests on is measured outside the ranks. The check trains the same model on one
device in its own process and compares both runs' losses with its own; it reads the
checkpoint the ranks saved itself (``read.py``: DCP's records only, never a pickle's code) and
finds one device's weights and Adam moments at the saved step in it; then it writes a
checkpoint of its own with the same entries holding another run's state at another step
(``reference.write_own``), which no rank trained to, and has a fresh ``TrainingState`` on the
ranks load it and train on: the step it restored and the losses must be one device's from
that state. A ``TrainingState`` that keeps Adam's state (or anything else) in the rank's
memory instead of the checkpoint fails one or the other.
"""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

from labkit.lessons.checkpoints.read import Unreadable, read_checkpoint
from labkit.lessons.checkpoints.reference import (
    BATCH,
    DTYPE,
    LR,
    MODEL,
    MOMENTS,
    RESUMED_AT,
    SAVED_AT,
    STEPS,
    adam_moments,
    batches,
    close,
    fmt,
    losses_close,
    match,
    missing,
    one_device,
    write_own,
)
from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.models import build_model, loss_fn, make_batch
from labkit.runtime.cluster.per_rank import PerRank

EXERCISE = "training_state"
WHERE = "TrainingState"
REWIRED = ("a rank sent back a report that labkit's check does not write: its code on that "
           "rank changed the check's measurements")


def _train(ctx, model, optimizer, steps, batches=None) -> list[float]:
    """Steps ``steps`` on this rank's slice of each step's batch; the whole-batch losses.
    ``batches``: (inputs, targets), this rank's slices of every step's batch, (steps, share,
    features) each; without them, slices of ``make_batch``'s."""
    share = BATCH // ctx.world_size
    mine = slice(ctx.rank * share, (ctx.rank + 1) * share)
    losses = []
    for step in steps:
        if batches is None:
            inputs, targets = (t[mine].to(ctx.device) for t in make_batch(MODEL, step, BATCH))
        else:
            inputs, targets = (t[step].to(ctx.device) for t in batches)
        loss = loss_fn(MODEL)(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        whole = loss.detach().clone()
        dist.all_reduce(whole)
        losses.append(whole.item() / ctx.world_size)
    return losses


def _fresh(ctx, seed: int, dtype: torch.dtype = torch.float32):
    """A DDP model with the weights of ``seed``, and an Adam with no state yet."""
    model = DistributedDataParallel(build_model(MODEL, ctx.device, seed=seed, dtype=dtype))
    return model, torch.optim.Adam(model.parameters(), lr=LR)


def _slices(batches, world_size: int) -> PerRank:
    """Each rank's slice of every step's batch, for rank r alone."""
    share = BATCH // world_size
    return PerRank(tuple(t[:, r * share:(r + 1) * share].clone() for t in batches)
                   for r in range(world_size))


def _restored(ctx, model, optimizer, step, batches) -> dict:
    """What a load put back (the step, the weights, Adam's state), and the run resumed from
    the step it restored."""
    found = {"step": step, "weights": [p.detach().cpu().clone() for p in model.parameters()],
             "moments": adam_moments(optimizer)}  # before the resumed run moves them
    found["resumed"] = (_train(ctx, model, optimizer, range(step, STEPS), batches)
                        if isinstance(step, int) and 0 <= step <= STEPS else [])
    return found


def _job(ctx, state_class, weights_seed: int, other_seed: int, batches, folder: str) -> dict:
    model, optimizer = _fresh(ctx, weights_seed, DTYPE)
    _train(ctx, model, optimizer, range(SAVED_AT), batches)
    dcp.save({"train": state_class(model, optimizer, SAVED_AT)}, checkpoint_id=folder)
    uninterrupted = _train(ctx, model, optimizer, range(SAVED_AT, STEPS), batches)
    model, optimizer = _fresh(ctx, other_seed, DTYPE)  # other weights, no Adam state
    restored = state_class(model, optimizer, 0)
    dcp.load({"train": restored}, checkpoint_id=folder)
    return {"uninterrupted": uninterrupted,
            **_restored(ctx, model, optimizer, _whole(restored.step), batches)}


def _resume_job(ctx, state_class, other_seed: int, batches, folder: str) -> dict:
    """Load the check's own checkpoint into a fresh TrainingState, and train on from it."""
    model, optimizer = _fresh(ctx, other_seed, DTYPE)
    restored = state_class(model, optimizer, 0)
    dcp.load({"train": restored}, checkpoint_id=folder)
    return _restored(ctx, model, optimizer, _whole(restored.step), batches)


def _whole(step):
    """The step as an int: a 0-d integer tensor (torchtitan saves its step so) counts as
    its value; anything else is returned as it is, for the judge to name."""
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
        return int(step.item())
    return step


def _well_formed(r, *runs: str) -> bool:
    """Whether a rank's report has the shape a job gives it (a rank's code may change it)."""
    def floats(value):
        return isinstance(value, list) and all(type(x) is float for x in value)
    return (isinstance(r, dict) and all(floats(r.get(run)) for run in runs)
            and isinstance(r.get("weights"), list) and isinstance(r.get("moments"), list)
            and all(isinstance(m, dict) for m in r["moments"]) and "step" in r)


def _judge(values: list, ref: dict) -> CheckResult | None:
    """What the ranks reported of the first run, set beside one device's (``ref``)."""
    if not all(_well_formed(v, "uninterrupted", "resumed") for v in values):
        return failed(EXERCISE, REWIRED)
    r, saved = values[0], ref["states"][SAVED_AT]
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
    if problem := uninterrupted_problem(values, ref, EXERCISE):
        return problem
    if not all(_weights_back(v["weights"], saved["weights"]) for v in values):
        return failed(EXERCISE, "the model's weights were not restored: after dcp.load the "
                      "fresh model still has its own weights",
                      ["state_dict() must return the model's state (get_state_dict), and "
                       "load_state_dict() must load it into the model (set_state_dict)"])
    if not all(_moments_back(v["moments"], saved["moments"]) and v["resumed"] == v[
            "uninterrupted"] and losses_close(v["resumed"], ref["losses"][SAVED_AT:])
               for v in values):
        return failed(EXERCISE, "the weights came back but Adam's state did not: the resumed "
                      f"losses {fmt(r['resumed'])} differ from the uninterrupted run's "
                      f"{fmt(r['uninterrupted'])}",
                      ["Adam keeps two moments per parameter and a step count: save and load "
                       "the optimizer's state too (get_state_dict / set_state_dict)"])
    return None


def uninterrupted_problem(values: list, ref: dict, exercise: str) -> CheckResult | None:
    """A failure if a rank's uninterrupted losses are not one device's (``ref``): the
    check's own training, on that rank, was changed."""
    for rank, v in enumerate(values):
        if not losses_close(v["uninterrupted"], ref["losses"][SAVED_AT:]):
            return failed(exercise, f"the uninterrupted losses rank {rank} reported, "
                          f"{fmt(v['uninterrupted'])}, are not the ones the check's model "
                          f"and data give ({fmt(ref['losses'][SAVED_AT:])}, computed outside "
                          "the ranks): its code on that rank changed the check's measurements")
    return None


def _weights_back(found: list, want: list) -> bool:
    return len(found) == len(want) and all(close(w, x) for w, x in zip(found, want, strict=True))


def _moments_back(found: list, want: list) -> bool:
    """Whether ``found`` (a rank's restored Adam state) is one device's ``want``."""
    def same(f: dict, w: dict) -> bool:
        step = f.get("step")
        return (set(f) == set(w) and isinstance(step, torch.Tensor) and step.numel() == 1
                and step.item() == w["step"].item()
                and all(close(f[k], w[k]) for k in MOMENTS[1:]))
    return len(found) == len(want) and all(same(f, w) for f, w in zip(found, want, strict=True))


def _judge_saved(folder: str, ref: dict):
    """The checkpoint the ranks saved, read here and set beside one device's state at the
    saved step: (what it holds, which entry is which), or the verdict."""
    try:
        saved = read_checkpoint(folder)
    except Unreadable as why:
        return failed(EXERCISE, f"the check could not read the checkpoint the ranks saved: "
                      f"{why}")
    found = match(saved, ref["states"][SAVED_AT])
    lost = missing(found, ref["states"][SAVED_AT])
    where = (f"at step {SAVED_AT} (the check read the folder itself, outside the ranks), yet "
             "the fresh {} got them back: they must travel in the checkpoint, through "
             "state_dict() and load_state_dict(), not stay in the rank's memory")
    if "weights" in lost:
        return failed(EXERCISE, "the checkpoint the ranks saved does not hold the model's "
                      "weights " + where.format("model"),
                      ["state_dict() returns the model's state (get_state_dict) for dcp.save "
                       "to write"])
    if lost:
        return failed(EXERCISE, "the checkpoint the ranks saved holds no Adam moments "
                      + where.format("optimizer"),
                      ["get_state_dict(model, optimizer) gives the optimizer's state beside "
                       "the model's: return both from state_dict()"])
    return saved, found


def judge_own(values: list, own: dict, exercise: str = EXERCISE,
              who: str = "the TrainingState says", advice: tuple = (
                  "load_state_dict() puts back what it is given, the state dict dcp.load "
                  "filled from the folder (set_state_dict), and sets self.step from it",)
              ) -> CheckResult | None:
    """What the ranks resumed from the check's own checkpoint (``_restored``'s reports),
    beside one device's run ``own``."""
    if not all(_well_formed(v, "resumed") for v in values):
        return failed(exercise, REWIRED)
    state, want = own["states"][RESUMED_AT], own["losses"][RESUMED_AT:]
    said = (f"resumed from the checkpoint the check wrote (your checkpoint's entries, holding "
            f"another run's weights and Adam moments at step {RESUMED_AT}), ")
    for v in values:
        if type(v["step"]) is not int or v["step"] != RESUMED_AT:
            return failed(exercise, said + f"{who} step {v['step']!r}, not {RESUMED_AT}",
                          advice)
        if not _weights_back(v["weights"], state["weights"]):
            return failed(exercise, said + "the model did not get its weights", advice)
        if not _moments_back(v["moments"], state["moments"]):
            return failed(exercise, said + "the optimizer did not get its Adam moments", advice)
        if not losses_close(v["resumed"], want):
            return failed(exercise, said + f"the losses {fmt(v['resumed'])} are not one "
                          f"device's from that state ({fmt(want)}, computed outside the "
                          "ranks)", advice)
    return None


def save_then_resume(cluster, exercise: str, where: str, job, resume_job, answers: tuple,
                     resume_answers: tuple, judge, judge_again, timeout: float | None):
    """The run both of notebook 10's checks make. ``job(ctx, *answers, weights_seed,
    other_seed, slices, folder)`` trains, saves into ``folder`` (chosen here), trains on and
    resumes; ``judge(values, one_device_run, folder)`` returns a failure, or what the saved
    checkpoint holds (``(saved, found)``, for ``write_own``). Then the check writes a
    checkpoint of its own with those entries, another run's state at ``RESUMED_AT``, and
    ``resume_job(ctx, *resume_answers, other_seed, slices, folder)`` resumes from it, judged
    by ``judge_again(values, own_run)``. Returns (the verdict or None, rank 0's first report).
    """
    n = cluster.world_size
    weights_seed, other_seed, own_seed, data_seed = (fresh_seed() for _ in range(4))
    data = batches(data_seed)
    with tempfile.TemporaryDirectory(prefix="labkit-check-", ignore_cleanup_errors=True) as tmp:
        saved_folder, own_folder = os.path.join(tmp, "saved"), os.path.join(tmp, "own")
        os.mkdir(saved_folder)
        outcome = run_checked(cluster, exercise, where, job, *answers, weights_seed,
                              other_seed, _slices(data, n), saved_folder, timeout=timeout)
        if outcome.verdict:
            return outcome.verdict, None
        verdict = judge(outcome.values, one_device(weights_seed, data), saved_folder)
        if isinstance(verdict, CheckResult):
            return verdict, None
        own = one_device(own_seed, data)
        if problem := write_own(own_folder, *verdict, own["states"][RESUMED_AT], RESUMED_AT):
            return failed(exercise, problem), None
        again = run_checked(cluster, exercise, where, resume_job, *resume_answers, other_seed,
                            _slices(data, n), own_folder, timeout=timeout)
        return again.verdict or judge_again(again.values, own), outcome.values[0]


def training_state(cluster, state_class, timeout: float | None = None) -> CheckResult:
    """Save with ``state_class``, resume with it on fresh weights, compare the losses; then
    resume with it from a checkpoint of the check's own."""
    n = cluster.world_size
    if BATCH % n:
        return failed(EXERCISE, f"the check splits a batch of {BATCH} over the ranks; "
                      f"{n} ranks do not divide it: resize the cluster to 1, 2, 4 or 8")
    verdict, r = save_then_resume(
        cluster, EXERCISE, WHERE, _job, _resume_job, (state_class,), (state_class,),
        lambda values, ref, folder: _judge(values, ref) or _judge_saved(folder, ref),
        judge_own, timeout)
    return verdict or passed(
        EXERCISE, f"resumed at step {SAVED_AT} on {n} ranks, the losses of steps "
        f"{SAVED_AT}-{STEPS - 1} equal the uninterrupted run's bit for bit",
        ["and one device's, computed by the check outside the ranks; the checkpoint holds "
         "one device's weights and Adam moments, and a resume from the check's own "
         f"checkpoint (another state, at step {RESUMED_AT}) trains on as one device does"],
        uninterrupted=r["uninterrupted"], resumed=r["resumed"])
