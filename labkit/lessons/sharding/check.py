"""Notebook 05's exercise: ZeRO stage 1 by hand.

The learner writes a class ``Zero1(ctx, params, lr)`` with a ``step()`` method, used after the
gradients were averaged (as DDP leaves them): each rank creates Adam's state for its own shard
of the parameters only, updates that shard, and then the updated parameters reach every rank
(a broadcast from each shard's owner, or an all-gather).

The check trains a small MLP for two steps this way on every rank, and compares: the weights
with one device's Adam on the whole batch; the optimizer state each rank holds (measured by the
suite's memory tracker) with the whole model's; and the collectives that ``step()`` ran, at
the cluster's rank count and at a second one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked
from labkit.lessons.exercise.wire import Traffic
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.runtime.memory import MemoryTracker, format_bytes

EXERCISE = "zero1"
MODEL = MLPConfig(d_in=32, d_hidden=64, n_layers=5, d_out=4)
BATCH, STEPS, LR = 32, 2, 1e-2


def _job(ctx, zero_class) -> dict:
    reference = build_model(MODEL, ctx.device)
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=LR)
    model = build_model(MODEL, ctx.device)
    tracker = MemoryTracker(ctx.rank)
    tracker.track_external(model)  # known as parameters, so that only Adam's state is "optimizer"
    share = BATCH // ctx.world_size
    mine = slice(ctx.rank * share, (ctx.rank + 1) * share)
    collectives = []
    with tracker:
        optimizer = zero_class(ctx, list(model.parameters()), LR)
    for step in range(STEPS):
        inputs, targets = (t.to(ctx.device) for t in make_batch(MODEL, step, BATCH))
        loss_fn(MODEL)(reference(inputs), targets).backward()
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        loss_fn(MODEL)(model(inputs[mine]), targets[mine]).backward()
        for p in model.parameters():  # averaged gradients, as DDP leaves them
            dist.all_reduce(p.grad)
            p.grad /= ctx.world_size
        with tracker, Traffic() as traffic:
            optimizer.step()
        collectives.append(traffic.collectives)
        model.zero_grad(set_to_none=True)
    errors = [(p - r).abs().max().item() for p, r in zip(model.parameters(),
                                                          reference.parameters(), strict=True)]
    state = 8 * sum(p.numel() for p in model.parameters())  # Adam: two fp32 moments
    return {"errors": errors, "optimizer_bytes": tracker.live()["optimizer"],
            "full_state": state, "collectives": collectives}


def zero1(cluster, zero_class, timeout: float | None = None) -> CheckResult:
    """Check ``zero_class(ctx, params, lr)`` and its ``step()`` on every rank of ``cluster``."""
    n = cluster.world_size
    if n < 2 or BATCH % n:
        return failed(EXERCISE, f"the check shards over 2, 4 or 8 ranks; this cluster has {n}")
    return at_two_sizes(cluster, lambda: _check(cluster, zero_class, timeout))


def _check(cluster, zero_class, timeout: float | None) -> CheckResult:
    n = cluster.world_size
    outcome = run_checked(cluster, EXERCISE, "Zero1", _job, zero_class, timeout=timeout,
                          hang_hint="Every rank must join each broadcast (or all-gather), "
                          "including ranks that own no part of that parameter.")
    if outcome.verdict:
        return outcome.verdict
    ranks = outcome.values
    full = ranks[0]["full_state"]
    held = [r["optimizer_bytes"] for r in ranks]
    problems = []
    for rank, r in enumerate(ranks):
        worst = max(r["errors"])
        if worst > 1e-5:
            layer = r["errors"].index(worst)
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
