"""Check for notebook 07's exercise: which ranks form each group of a layout.

The learner writes ``mesh_groups(degrees, dim)``: ``degrees`` is {"pp", "dp", "fsdp", "tp":
degree} (mesh order, pp outermost, tp innermost) and the answer is the list of groups of
ranks that communicate along ``dim``. Every rank calls it for several layouts and compares
the group it would be in with the one PyTorch's DeviceMesh (the run's own mesh, built by
``labkit.training.layout.mesh``) gives that rank.
"""

from __future__ import annotations

import operator

from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, describe_exception, run_checked
from labkit.training.layout.layout import MESH_ORDER, Layout

EXERCISE = "mesh_groups"
WHERE = "mesh_groups(degrees, dim)"
# Layouts checked at each rank count: every dimension appears, alone and composed.
LAYOUTS = {2: [Layout(dp=2), Layout(tp=2), Layout(pp=2), Layout(fsdp=2)],
           4: [Layout(dp=2, tp=2), Layout(fsdp=2, tp=2), Layout(pp=2, dp=2),
               Layout(dp=2, fsdp=2), Layout(pp=2, tp=2)],
           8: [Layout(pp=2, dp=2, tp=2), Layout(dp=2, fsdp=2, tp=2)]}
HINT = ("ranks are numbered along (pp, dp, fsdp, tp) with tp innermost: a tp group is "
        "consecutive ranks, an fsdp group strides over tp ranks, a dp group over fsdp x tp, "
        "a pp group over dp x fsdp x tp")


def _on_rank(ctx, fn, layouts):
    """Per (layout, dim): the learner's groups and this rank's group on the real mesh."""
    import torch.distributed as dist

    from labkit.training.layout.mesh import mesh_for

    out = []
    for layout in layouts:
        mesh = mesh_for(layout, ctx.device.type)
        for dim in MESH_ORDER:
            if getattr(layout, dim) == 1:
                continue
            mine = fn(dict(layout.degrees), dim)
            real = dist.get_process_group_ranks(mesh.get_group(dim))
            out.append((str(layout), dim, mine, sorted(real)))
    return out


def _as_groups(groups) -> list[list[int]]:
    """``groups`` as lists of ints (read once: a group may be an iterator). Raises TypeError
    unless every member is a whole number (int, numpy or tensor integer; not 0.4, not "0")."""
    return [[operator.index(r) for r in group] for group in groups]


def _judge_groups(layout: str, dim: str, groups, size: int) -> str | list[list[int]]:
    """What is wrong with ``groups`` as a partition of the ranks, or the groups as ints."""
    try:
        groups = _as_groups(groups)
    except TypeError as exc:
        return (f"for {layout}, {WHERE} returned {groups!r} for {dim!r}: return a list of "
                f"groups, each a list of ranks (whole numbers) ({describe_exception(exc)})")
    members = [r for group in groups for r in group]
    missing = sorted(set(range(size)) - set(members))
    twice = sorted({r for r in members if members.count(r) > 1})
    if missing or twice:
        what = (f"leave out rank(s) {missing}" if missing else
                f"put rank(s) {twice} in more than one group")
        return (f"for {layout}, your {dim} groups {groups} {what}: every rank is in exactly "
                f"one {dim} group")
    return groups


def _judge(values, world_size: int) -> CheckResult:
    for rank, rows in enumerate(values):
        for layout, dim, mine, real in rows:
            mine = _judge_groups(layout, dim, mine, world_size)
            if isinstance(mine, str):
                return failed(EXERCISE, mine, [HINT])
            yours = next(sorted(g) for g in mine if rank in g)
            if yours != real:
                return failed(EXERCISE, f"for {layout}, rank {rank}'s {dim} group on the real "
                              f"DeviceMesh is {real}, yours is {yours}", [HINT],
                              layout=layout, dim=dim, rank=rank, real=real, yours=yours)
    checked = sorted({(layout, dim) for rows in values for layout, dim, _, _ in rows})
    return passed(EXERCISE, f"every rank's group matches PyTorch's DeviceMesh for "
                  f"{len(checked)} (layout, dimension) pairs on {world_size} ranks",
                  [f"{layout}: {dim}" for layout, dim in checked])


def mesh_groups(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Run ``fn`` on every rank for the layouts of this rank count and compare each rank's
    group with the real mesh's; then again at a second rank count."""

    def once() -> CheckResult:
        n = cluster.world_size
        layouts = LAYOUTS.get(n)
        if layouts is None:
            return failed(EXERCISE, f"this check runs on 2, 4 or 8 ranks, not {n}: resize the "
                          "cluster")
        outcome = run_checked(cluster, EXERCISE, WHERE, _on_rank, fn, layouts, timeout=timeout)
        return outcome.verdict or _judge(outcome.values, n)

    return at_two_sizes(cluster, once)
