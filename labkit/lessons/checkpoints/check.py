"""Notebook 10's exercise: what a checkpoint must hold for a run to resume exactly.

The learner writes ``TrainingState(model, optimizer, step)``, a DCP ``Stateful`` with
``state_dict()`` and ``load_state_dict(state_dict)``. On every rank the check trains a small
MLP (in float64) under DDP for two steps, saves ``{"train": TrainingState(...)}`` with
``dcp.save``, trains two more (the uninterrupted run), then builds a fresh model and optimizer
with other weights, loads the checkpoint into a new ``TrainingState`` and trains from the step
it restored. The weights, the data and the fresh model's other weights come from seeds drawn
for each run, each rank receiving only its own slice of each batch. The ranks return what was
restored (the step, the weights, Adam's moments) and the losses; the check trains the same
model on one device in its own process and compares: the restored weights and moments with
its own at the saved step, both runs' losses with its own. The resumed losses must also equal
the uninterrupted ones bit for bit on the ranks; if not, the check says what was not
restored: the step (the data position), the weights, or Adam's moments.
"""

from __future__ import annotations

import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.nn.parallel import DistributedDataParallel

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import run_checked
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.runtime.cluster.per_rank import PerRank

EXERCISE = "training_state"
WHERE = "TrainingState"
MODEL = MLPConfig(d_in=16, d_hidden=32, n_layers=3, d_out=4)
BATCH, SAVED_AT, STEPS, LR = 16, 2, 4, 1e-2
DTYPE = torch.float64  # one device's sums equal DDP's to ~1e-15; compared at ~1e-9
MOMENTS = ("step", "exp_avg", "exp_avg_sq")  # Adam's state per parameter


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


def _batches(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every step's whole batch from ``seed``: inputs (steps, batch, d_in), targets (steps,
    batch, d_out), in ``DTYPE``."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(STEPS, BATCH, MODEL.d_in, generator=generator, dtype=DTYPE),
            torch.randn(STEPS, BATCH, MODEL.d_out, generator=generator, dtype=DTYPE))


def _slices(batches, world_size: int) -> PerRank:
    """Each rank's slice of every step's batch, for rank r alone."""
    share = BATCH // world_size
    return PerRank(tuple(t[:, r * share:(r + 1) * share].clone() for t in batches)
                   for r in range(world_size))


def _adam_moments(optimizer) -> list[dict]:
    """Per parameter, in order: Adam's state tensors by name (empty before its first step)."""
    return [{k: v.detach().cpu().clone() for k, v in optimizer.state.get(p, {}).items()
             if k in MOMENTS and isinstance(v, torch.Tensor)}
            for group in optimizer.param_groups for p in group["params"]]


def _job(ctx, state_class, weights_seed: int, other_seed: int, batches) -> dict:
    folder = [tempfile.mkdtemp(prefix="labkit-check-") if ctx.rank == 0 else None]
    dist.broadcast_object_list(folder, src=0)
    try:
        model, optimizer = _fresh(ctx, weights_seed, DTYPE)
        _train(ctx, model, optimizer, range(SAVED_AT), batches)
        dcp.save({"train": state_class(model, optimizer, SAVED_AT)}, checkpoint_id=folder[0])
        uninterrupted = _train(ctx, model, optimizer, range(SAVED_AT, STEPS), batches)
        model, optimizer = _fresh(ctx, other_seed, DTYPE)  # other weights, no Adam state
        restored = state_class(model, optimizer, 0)
        dcp.load({"train": restored}, checkpoint_id=folder[0])
        weights = [p.detach().cpu().clone() for p in model.parameters()]
        moments = _adam_moments(optimizer)
        step = _whole(restored.step)
        resumed = _train(ctx, model, optimizer, range(step, STEPS), batches) if isinstance(
            step, int) and 0 <= step <= STEPS else []
    finally:
        dist.barrier()
        if ctx.rank == 0:
            shutil.rmtree(folder[0], ignore_errors=True)
    return {"uninterrupted": uninterrupted, "resumed": resumed, "step": step,
            "weights": weights, "moments": moments}


def _whole(step):
    """The step as an int: a 0-d integer tensor (torchtitan saves its step so) counts as
    its value; anything else is returned as it is, for the judge to name."""
    if isinstance(step, torch.Tensor) and step.numel() == 1 and not step.is_floating_point():
        return int(step.item())
    return step


def _reference(weights_seed: int, batches) -> dict:
    """One device's run, here: the weights and Adam's state at the saved step, every loss."""
    model = build_model(MODEL, "cpu", seed=weights_seed, dtype=DTYPE)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    out = {"losses": []}
    for step in range(STEPS):
        if step == SAVED_AT:
            out["weights"] = [p.detach().clone() for p in model.parameters()]
            out["moments"] = _adam_moments(optimizer)
        loss = loss_fn(MODEL)(model(batches[0][step]), batches[1][step])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        out["losses"].append(loss.item())
    return out


def _close(found, want) -> bool:
    return (isinstance(found, torch.Tensor) and found.shape == want.shape
            and found.dtype == want.dtype and torch.allclose(found, want, rtol=1e-9,
                                                             atol=1e-10))


def _losses_close(found: list, want: list) -> bool:
    return len(found) == len(want) and all(
        abs(a - b) <= 1e-9 * abs(b) + 1e-12 for a, b in zip(found, want, strict=True))


def _well_formed(r) -> bool:
    """Whether a rank's report has the shape ``_job`` gives it (a rank's code may change it)."""
    def floats(value):
        return isinstance(value, list) and all(type(x) is float for x in value)
    return (isinstance(r, dict) and floats(r.get("uninterrupted")) and floats(r.get("resumed"))
            and isinstance(r.get("weights"), list) and isinstance(r.get("moments"), list)
            and all(isinstance(m, dict) for m in r["moments"]) and "step" in r)


def _judge(values: list, ref: dict) -> CheckResult:
    if not all(_well_formed(v) for v in values):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")
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
    for rank, v in enumerate(values):
        if not _losses_close(v["uninterrupted"], ref["losses"][SAVED_AT:]):
            return failed(EXERCISE, f"the uninterrupted losses rank {rank} reported, "
                          f"{_fmt(v['uninterrupted'])}, are not the ones the check's model "
                          f"and data give ({_fmt(ref['losses'][SAVED_AT:])}, computed outside "
                          "the ranks): its code on that rank changed the check's measurements")
    if not all(len(v["weights"]) == len(ref["weights"]) and all(
            _close(w, want) for w, want in zip(v["weights"], ref["weights"], strict=True))
            for v in values):
        return failed(EXERCISE, "the model's weights were not restored: after dcp.load the "
                      "fresh model still has its own weights",
                      ["state_dict() must return the model's state (get_state_dict), and "
                       "load_state_dict() must load it into the model (set_state_dict)"])
    if not all(_moments_back(v["moments"], ref["moments"]) and v["resumed"] == v["uninterrupted"]
               and _losses_close(v["resumed"], ref["losses"][SAVED_AT:]) for v in values):
        return failed(EXERCISE, "the weights came back but Adam's state did not: the resumed "
                      f"losses {_fmt(r['resumed'])} differ from the uninterrupted run's "
                      f"{_fmt(r['uninterrupted'])}",
                      ["Adam keeps two moments per parameter and a step count: save and load "
                       "the optimizer's state too (get_state_dict / set_state_dict)"])
    return passed(EXERCISE, f"resumed at step {SAVED_AT} on {len(values)} ranks, the losses "
                  f"of steps {SAVED_AT}-{STEPS - 1} equal the uninterrupted run's bit for bit",
                  ["and one device's, computed by the check outside the ranks, as are the "
                   "restored weights and Adam's moments"],
                  uninterrupted=r["uninterrupted"], resumed=r["resumed"])


def _moments_back(found: list, want: list) -> bool:
    """Whether ``found`` (a rank's restored Adam state) is one device's at the saved step."""
    def same(f: dict, w: dict) -> bool:
        step = f.get("step")
        return (set(f) == set(w) and isinstance(step, torch.Tensor) and step.numel() == 1
                and step.item() == w["step"].item()
                and all(_close(f[k], w[k]) for k in MOMENTS[1:]))
    return len(found) == len(want) and all(same(f, w) for f, w in zip(found, want, strict=True))


def _fmt(losses) -> str:
    return "[" + ", ".join(f"{x:.6f}" for x in losses) + "]"


def training_state(cluster, state_class, timeout: float | None = None) -> CheckResult:
    """Save with ``state_class``, resume with it on fresh weights, compare the losses."""
    n = cluster.world_size
    if BATCH % n:
        return failed(EXERCISE, f"the check splits a batch of {BATCH} over the ranks; "
                      f"{n} ranks do not divide it: resize the cluster to 1, 2, 4 or 8")
    weights_seed, other_seed, data_seed = fresh_seed(), fresh_seed(), fresh_seed()
    batches = _batches(data_seed)
    outcome = run_checked(cluster, EXERCISE, WHERE, _job, state_class, weights_seed,
                          other_seed, _slices(batches, n), timeout=timeout)
    return outcome.verdict or _judge(outcome.values, _reference(weights_seed, batches))
