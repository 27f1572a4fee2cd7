"""Notebook 02's exercises: average gradients by hand, then bucket them in a DDP hook.

* ``average_gradients(ctx, model)``: after each rank's backward on its slice of the batch,
  leave every gradient equal to the gradient of the whole batch (AllReduce, then divide).
* ``bucket_hook(state, bucket)``: a DDP communication hook (``register_comm_hook``) that
  averages one bucket of gradients and returns a future of the result, as DDP's default does.

Both checks train the same small MLP on every rank with a slice of one batch, and compare the
gradients each rank ends with against one device's on the whole batch. The weights and the
batch come from seeds drawn for each run (``outside.fresh_seed``); each rank receives only its
own slice (``PerRank``), so it cannot make the whole batch's gradients without the others'.
The references (the whole batch's gradients, and each slice's own) are computed here, in the
check's process, never on the ranks, which send back only the gradients and what they
counted: the collectives (at least one for the first check; one AllReduce per bucket and
nothing else for the second) and the buckets DDP handed the hook are the rank's word. Both
run at the cluster's rank count and at a second one.
"""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel

from labkit.lessons.exercise import reports
from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.runtime.cluster.per_rank import PerRank

MODEL = MLPConfig(d_in=32, d_hidden=64, n_layers=4, d_out=4)
BATCH = 32
BUCKET_CAP_MB = 0.02  # small, so that DDP makes several buckets of this small model (2)


class _Run:
    """One check run's inputs, drawn here: the weights' seed and the whole batch (CPU)."""

    def __init__(self, world_size: int):
        self.weights_seed = fresh_seed()
        # make_batch seeds a generator with seed * 1_000_003 + step: 39 bits keep it in 64
        self.inputs, self.targets = make_batch(MODEL, 0, BATCH, seed=fresh_seed() >> 24)
        self.share = BATCH // world_size
        self.world_size = world_size

    def mine(self, rank: int) -> slice:
        return slice(rank * self.share, (rank + 1) * self.share)

    def slices(self) -> PerRank:
        """Each rank's (inputs, targets), for that rank alone."""
        return PerRank((self.inputs[self.mine(r)], self.targets[self.mine(r)])
                       for r in range(self.world_size))

    def gradients(self, rows: slice = slice(None)) -> list[torch.Tensor]:
        """One device's gradients on ``rows`` of the batch (all of it by default)."""
        model = build_model(MODEL, "cpu", seed=self.weights_seed)
        loss_fn(MODEL)(model(self.inputs[rows]), self.targets[rows]).backward()
        return [p.grad.detach().clone() for p in model.parameters()]


def _model_and_slice(ctx, weights_seed: int, batch):
    model = build_model(MODEL, ctx.device, seed=weights_seed)
    inputs, targets = (t.to(ctx.device) for t in batch)
    return model, inputs, targets


def _grads(model) -> list:
    return [None if p.grad is None else p.grad.detach().cpu().clone()
            for p in model.parameters()]


def _average_job(ctx, fn, weights_seed: int, batch) -> dict:
    model, inputs, targets = _model_and_slice(ctx, weights_seed, batch)
    loss_fn(MODEL)(model(inputs), targets).backward()
    with Traffic() as traffic:
        fn(ctx, model)
    return {"grads": _grads(model), "traffic": traffic.to_dict()}


def _hook_job(ctx, hook, weights_seed: int, batch) -> dict:
    model, inputs, targets = _model_and_slice(ctx, weights_seed, batch)
    calls = [0]

    def counted(state, bucket):
        calls[0] += 1
        return hook(state, bucket)

    ddp = DistributedDataParallel(model, bucket_cap_mb=BUCKET_CAP_MB)
    ddp.register_comm_hook(None, counted)
    # DDP's first backward puts every gradient in one bucket, then it rebuilds the buckets by
    # size (BUCKET_CAP_MB): the checked step is the second one, with several buckets.
    loss_fn(MODEL)(ddp(inputs), targets).backward()
    model.zero_grad(set_to_none=True)
    calls[0] = 0
    with Traffic() as traffic:
        loss_fn(MODEL)(ddp(inputs), targets).backward()
    return {"grads": _grads(model), "traffic": traffic.to_dict(), "buckets": calls[0]}


def _well_formed(found, shapes: list[tuple], hook: bool) -> bool:
    kinds = {"grads": lambda g: reports.tensor_list(g, shapes, allow_none=True,
                                                             dtype=torch.float32),
             "traffic": reports.traffic}
    if hook:
        kinds["buckets"] = lambda b: type(b) is int
    return reports.fields(found, kinds)


def _compared(run: _Run, found: list, hook: bool) -> list[dict] | CheckResult:
    """The ranks' reports beside the references computed here (the whole batch's gradients,
    and for ``average_gradients`` each rank's own slice's), or the verdict on a malformed
    report."""
    exercise = "bucket_hook" if hook else "average_gradients"
    reference = run.gradients()
    shapes = [tuple(g.shape) for g in reference]
    for rank, r in enumerate(found):
        if not _well_formed(r, shapes, hook):
            return reports.forged(exercise, rank)
    return [dict(r, reference=reference,
                 local=None if hook else run.gradients(run.mine(rank)))
            for rank, r in enumerate(found)]


def _ratio(grads, reference) -> float | None:
    """The scalar g/ref when the gradients are a multiple of the reference, else None."""
    flat = torch.cat([g.flatten() for g in grads])
    ref = torch.cat([r.flatten() for r in reference])
    ratio = (flat @ ref / (ref @ ref)).item()
    return ratio if torch.allclose(flat, ratio * ref, rtol=1e-4, atol=1e-6) else None


def _value_problem(rank: int, r: dict, world_size: int) -> str | None:
    if any(g is None for g in r["grads"]):
        return f"rank {rank}: some parameters have no gradient left (p.grad is None)"
    if all(torch.allclose(g, ref, rtol=1e-4, atol=1e-6)
           for g, ref in zip(r["grads"], r["reference"], strict=True)):
        return None
    if r["local"] is not None and all(torch.allclose(g, loc, rtol=1e-4, atol=1e-6) for g, loc
                                      in zip(r["grads"], r["local"], strict=True)):
        return (f"rank {rank}'s gradients are still those of its own slice: nothing was "
                "averaged (did the collective's result land in p.grad?)")
    ratio = _ratio(r["grads"], r["reference"])
    if ratio is not None and abs(ratio - world_size) < 1e-3:
        return (f"rank {rank}'s gradients are {world_size}x the whole batch's: AllReduce "
                f"sums, so divide by the number of ranks ({world_size})")
    if ratio is not None:
        return f"rank {rank}'s gradients are {ratio:.3g}x the whole batch's"
    return (f"rank {rank}'s gradients differ from one device's on the whole batch: only rank "
            "0 has the sum if you reduce to one rank; every rank needs it (AllReduce)"
            if rank else f"rank {rank}'s gradients differ from one device's on the whole batch")


def _verdict(exercise: str, ranks: list[dict], world_size: int, pattern) -> CheckResult:
    problems = [p for rank, r in enumerate(ranks) if (p := _value_problem(rank, r, world_size))]
    problems += pattern(ranks)
    measured = {"collectives": [r["traffic"]["collectives"] for r in ranks],
                "buckets": [r.get("buckets") for r in ranks]}
    if problems:
        return failed(exercise, problems[0], problems[1:], **measured)
    kinds = ranks[0]["traffic"]["collectives"]
    return passed(exercise, "every rank holds the whole batch's gradients, as one device "
                  "would, with " + ", ".join(f"{c[0]} {k} call(s) of {c[1]} bytes in all"
                                             for k, c in kinds.items()) + ".", **measured)


def average_gradients(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Check ``fn(ctx, model)`` (averages the gradients in place) on every rank."""
    return _where_the_batch_splits(cluster, "average_gradients",
                                   lambda: _average_once(cluster, fn, timeout))


def _where_the_batch_splits(cluster, exercise: str, check_once) -> CheckResult:
    """``check_once`` at two rank counts (``at_two_sizes``), on a cluster whose rank count
    divides the check's batch; otherwise a verdict that says which counts do."""
    if BATCH % cluster.world_size:
        return failed(exercise, f"the check splits {BATCH} samples: use 1, 2, 4 or 8 ranks")
    return at_two_sizes(cluster, check_once)


def _average_once(cluster, fn, timeout: float | None) -> CheckResult:
    exercise, run = "average_gradients", _Run(cluster.world_size)
    outcome = run_checked(cluster, exercise, "average_gradients", _average_job, fn,
                          run.weights_seed, run.slices(), timeout=timeout,
                          hang_hint="A rank is waiting in a collective that another rank "
                          "never calls: every rank must make the same collective calls, in "
                          "the same order.")
    if outcome.verdict:
        return outcome.verdict
    ranks = _compared(run, outcome.values, hook=False)
    if isinstance(ranks, CheckResult):
        return ranks

    def pattern(ranks):
        kinds = ranks[0]["traffic"]["collectives"]
        if cluster.world_size > 1 and not kinds:
            return ["no collective ran: the gradients must be summed across ranks"]
        return []

    return _verdict(exercise, ranks, cluster.world_size, pattern)


def bucket_hook(cluster, hook, timeout: float | None = None) -> CheckResult:
    """Check a DDP communication hook ``hook(state, bucket) -> Future`` on every rank."""
    return _where_the_batch_splits(cluster, "bucket_hook",
                                   lambda: _hook_once(cluster, hook, timeout))


def _hook_once(cluster, hook, timeout: float | None) -> CheckResult:
    exercise, run = "bucket_hook", _Run(cluster.world_size)
    outcome = run_checked(cluster, exercise, "bucket_hook", _hook_job, hook, run.weights_seed,
                          run.slices(), timeout=timeout,
                          hang_hint="DDP waits for the future your hook returns: return the "
                          "future of the collective (work.get_future()), chained with .then "
                          "to hand back the averaged bucket.")
    if outcome.verdict:
        return outcome.verdict
    ranks = _compared(run, outcome.values, hook=True)
    if isinstance(ranks, CheckResult):
        return ranks

    def pattern(ranks):
        r = ranks[0]
        kinds = r["traffic"]["collectives"]
        calls = sum(c[0] for c in kinds.values())
        if calls > r["buckets"]:
            return [f"your hook issued {calls} collectives for {r['buckets']} buckets: "
                    "average the bucket's flat buffer, bucket.buffer(), in one AllReduce"]
        others = sorted(set(kinds) - {"all_reduce"})
        if others:
            return [f"your hook ran {', '.join(others)}: average the bucket with one "
                    "all_reduce (an all-gather receives N copies of the bucket, where a ring "
                    "AllReduce moves 2(N-1)/N of it)"]
        return []

    return _verdict(exercise, ranks, cluster.world_size, pattern)
