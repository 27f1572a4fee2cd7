"""Notebook 05's exercise: ZeRO stage 1 by hand.

The learner writes a class ``Zero1(ctx, params, lr)`` with a ``step()`` method, used after the
gradients were averaged (as DDP leaves them): each rank creates Adam's state for its own shard
of the parameters only, updates that shard, and then the updated parameters reach every rank
(a broadcast from each shard's owner, or an all-gather).

The check trains a small MLP for two steps this way on every rank, and compares: the weights
with one device's Adam on the whole batch; the optimizer state each rank holds (measured by the
suite's memory tracker) with the whole model's; and the collectives that ``step()`` ran, at
the cluster's rank count and at a second one.

The weights and the batches come from seeds drawn for each run (``outside.fresh_seed``), and
each rank receives only its own slice of each batch (``PerRank``); one device's Adam is run
here, in the check's process, and the ranks send back only their weights, the bytes of Adam's
state they held and the collectives ``step()`` ran. Those two are the rank's word: measured on
the rank, where the learner's code could change them.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.lessons.exercise import reports
from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.runtime.cluster.per_rank import PerRank
from labkit.runtime.memory import MemoryTracker, format_bytes

EXERCISE = "zero1"
MODEL = MLPConfig(d_in=32, d_hidden=64, n_layers=5, d_out=4)
BATCH, STEPS, LR = 32, 2, 1e-2
# Adam divides each gradient by its own size, so the rounding between averaged slices and one
# device's whole batch reaches the weights: up to 9e-5 over 300 drawn runs (median 6e-7). A
# weight its owner never sent differs by about LR, a hundred times more than this bound.
WEIGHT_TOLERANCE = 1e-3


class _Run:
    """One check run's inputs, drawn here: the weights' seed and every step's whole batch."""

    def __init__(self, world_size: int):
        self.weights_seed, data_seed = fresh_seed(), fresh_seed() >> 24  # 39 bits: make_batch
        self.batches = [make_batch(MODEL, step, BATCH, seed=data_seed) for step in range(STEPS)]
        self.world_size = world_size

    def slices(self) -> PerRank:
        """Each rank's slice of every step's batch, for that rank alone."""
        share = BATCH // self.world_size
        return PerRank([(x[r * share:(r + 1) * share], y[r * share:(r + 1) * share])
                        for x, y in self.batches] for r in range(self.world_size))

    def reference(self) -> list[torch.Tensor]:
        """One device's weights after Adam's ``STEPS`` steps on the whole batches."""
        model = build_model(MODEL, "cpu", seed=self.weights_seed)
        optimizer = torch.optim.Adam(model.parameters(), lr=LR)
        for inputs, targets in self.batches:
            loss_fn(MODEL)(model(inputs), targets).backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()]


def _job(ctx, zero_class, weights_seed: int, slices) -> dict:
    model = build_model(MODEL, ctx.device, seed=weights_seed)
    tracker = MemoryTracker(ctx.rank)
    tracker.track_external(model)  # known as parameters, so that only Adam's state is "optimizer"
    collectives = []
    with tracker:
        optimizer = zero_class(ctx, list(model.parameters()), LR)
    for inputs, targets in slices:
        inputs, targets = inputs.to(ctx.device), targets.to(ctx.device)
        loss_fn(MODEL)(model(inputs), targets).backward()
        for p in model.parameters():  # averaged gradients, as DDP leaves them
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
        with tracker, Traffic() as traffic:
            optimizer.step()
        collectives.append(traffic.collectives)
        model.zero_grad(set_to_none=True)
    return {"params": [p.detach().cpu().clone() for p in model.parameters()],
            "optimizer_bytes": tracker.live()["optimizer"], "collectives": collectives}


def _errors(ranks: list, reference: list[torch.Tensor]) -> list[list[float]] | CheckResult:
    """Each rank's largest difference from one device's weights, parameter by parameter; or
    the verdict on a report the job does not write."""
    shapes = [tuple(r.shape) for r in reference]
    kinds = {"params": lambda p: reports.tensor_list(p, shapes),
             "optimizer_bytes": lambda b: type(b) is int,
             "collectives": lambda c: isinstance(c, list) and len(c) == STEPS
             and all(map(reports.collectives, c))}
    for rank, r in enumerate(ranks):
        if not reports.fields(r, kinds):
            return reports.forged(EXERCISE, rank)
    return [[(p.float() - ref).abs().nan_to_num(nan=float("inf")).max().item()  # NaN: differs
             for p, ref in zip(r["params"], reference, strict=True)] for r in ranks]


def zero1(cluster, zero_class, timeout: float | None = None) -> CheckResult:
    """Check ``zero_class(ctx, params, lr)`` and its ``step()`` on every rank of ``cluster``."""
    n = cluster.world_size
    if n < 2 or BATCH % n:
        return failed(EXERCISE, f"the check shards over 2, 4 or 8 ranks; this cluster has {n}")
    return at_two_sizes(cluster, lambda: _check(cluster, zero_class, timeout))


def _check(cluster, zero_class, timeout: float | None) -> CheckResult:
    n, run = cluster.world_size, _Run(cluster.world_size)
    outcome = run_checked(cluster, EXERCISE, "Zero1", _job, zero_class, run.weights_seed,
                          run.slices(), timeout=timeout,
                          hang_hint="Every rank must join each broadcast (or all-gather), "
                          "including ranks that own no part of that parameter.")
    if outcome.verdict:
        return outcome.verdict
    ranks, reference = outcome.values, run.reference()
    errors = _errors(ranks, reference)
    if isinstance(errors, CheckResult):
        return errors
    full = 8 * sum(p.numel() for p in reference)  # Adam: two fp32 moments
    held = [r["optimizer_bytes"] for r in ranks]
    problems = []
    for rank, error in enumerate(errors):
        worst = max(error)
        if worst > WEIGHT_TOLERANCE:
            layer = error.index(worst)
            problems.append(f"rank {rank}'s weights differ from one device's Adam after "
                            f"{STEPS} steps (parameter {layer}, by {worst:.2g}): did every "
                            "rank receive the parameters their owner updated?")
    fullest = max(range(n), key=held.__getitem__)
    if sum(held) > 1.5 * full:
        problems.append(f"the ranks hold {sum(held) / full:.1f} copies of Adam's state "
                        f"({format_bytes(held[fullest])} on rank {fullest}, the whole model's "
                        f"is {format_bytes(full)}): create each rank's optimizer over its own "
                        "shard of the parameters only")
    elif sum(held) < 0.9 * full:
        problems.append(f"the ranks hold {format_bytes(sum(held))} of Adam state together, "
                        f"less than one copy ({format_bytes(full)}): every parameter needs an "
                        "owner that updates it")
    elif held[fullest] > (1 / n + 0.25) * full:
        problems.append(f"rank {fullest} holds {held[fullest] / full:.0%} of Adam's state: the "
                        "shards are unbalanced; assign parameters by size (largest first, each "
                        "to the rank holding the fewest numbers so far)")
    kinds = ranks[0]["collectives"][-1]
    if not set(kinds) & {"broadcast", "all_gather"}:
        problems.append(f"step() ran {', '.join(kinds) or 'no collective'}: after updating its "
                        "shard, each rank must send it to the others (broadcast from the "
                        "owner, or all-gather)")
    measured = {"optimizer_bytes": held, "full_state_bytes": full,
                "collectives": ranks[0]["collectives"]}
    if problems:
        return failed(EXERCISE, problems[0], problems[1:], **measured)
    return passed(EXERCISE, f"weights equal one device's Adam after {STEPS} steps; Adam's state "
                  "per rank: " + ", ".join(f"{h / full:.0%}" for h in held)
                  + f" of the whole model's {format_bytes(full)} (1/N = {1 / n:.0%}).",
                  **measured)
