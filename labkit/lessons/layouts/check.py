"""Check for notebook 07's exercise: which ranks form each group of a layout.

The learner writes ``mesh_groups(degrees, dim)``: ``degrees`` is {"pp", "dp", "fsdp", "tp":
degree} (mesh order, pp outermost, tp innermost) and the answer is the list of groups of
ranks that communicate along ``dim``. Every rank calls it for several layouts of its rank
count, and for layouts of more ranks drawn for each run (so no table of answers passes). The
ranks return the groups the learner's function gave and, for the layouts of their count, the
group PyTorch's DeviceMesh (the run's own mesh, built by ``labkit.training.layout.mesh``)
gives that rank. The check, in its own process, computes every layout's groups from the
grid (``Layout.groups``), compares the learner's with them, and the DeviceMesh's too: a mesh
that reports another group than the grid's is a rank whose measuring was changed.
"""

from __future__ import annotations

import collections
import itertools
import operator
import random

from labkit.lessons.exercise.outside import fresh_seed
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
DRAWN = 2  # layouts of more ranks than the cluster's, drawn for each run
HINT = ("ranks are numbered along (pp, dp, fsdp, tp) with tp innermost: a tp group is "
        "consecutive ranks, an fsdp group strides over tp ranks, a dp group over fsdp x tp, "
        "a pp group over dp x fsdp x tp")


def drawn_layouts(seed: int) -> list[Layout]:
    """``DRAWN`` layouts from ``seed``: degrees 1 to 3 along pp, dp, fsdp and tp, at least two
    of them above 1 (up to 81 ranks: the learner's function is judged on them here)."""
    pick, out = random.Random(seed), []
    while len(out) < DRAWN:
        degrees = {dim: pick.randint(1, 3) for dim in ("pp", "dp", "fsdp", "tp")}
        if sum(d > 1 for d in degrees.values()) >= 2:
            out.append(Layout(**degrees))
    return out


def _pairs(layouts) -> list[tuple[Layout, str]]:
    """The (layout, dim) pairs checked: every dimension of degree above 1."""
    return [(layout, dim) for layout in layouts for dim in MESH_ORDER if getattr(layout, dim) > 1]


def _on_rank(ctx, fn, layouts, drawn):
    """Per (layout, dim) of ``_pairs(layouts + drawn)``: the learner's groups and, for the
    layouts of this rank count, this rank's group on the real mesh (None for drawn ones)."""
    import torch.distributed as dist

    from labkit.training.layout.mesh import mesh_for

    out = []
    for layout, dim in _pairs(layouts):
        mesh = mesh_for(layout, ctx.device.type)
        mine = fn(dict(layout.degrees), dim)
        out.append((mine, sorted(dist.get_process_group_ranks(mesh.get_group(dim)))))
    for layout, dim in _pairs(drawn):
        out.append((fn(dict(layout.degrees), dim), None))
    return out


def _as_groups(groups, size: int) -> list[list[int]]:
    """``groups`` as lists of ints (read once: a group may be an iterator). Raises TypeError
    unless every member is a whole number (int, numpy or tensor integer; not 0.4, not "0"),
    and ValueError past ``size`` members (a rank may send ``range(10**18)``)."""
    out, members = [], 0
    for group in groups:
        out.append([operator.index(r) for r in itertools.islice(group, size + 1 - members)])
        members += len(out[-1])
        if members > size:
            raise ValueError(f"more members than the layout's {size} ranks")
    return out


def _short(value, limit: int = 300) -> str:
    """``repr(value)``, cut at ``limit`` characters (an answer may return a huge list)."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _judge_groups(layout: str, dim: str, groups, size: int) -> str | list[list[int]]:
    """What is wrong with ``groups`` as a partition of the ranks, or the groups as ints."""
    try:
        groups = _as_groups(groups, size)
    except TypeError as exc:
        return (f"for {layout}, {WHERE} returned {_short(groups)} for {dim!r}: return a list "
                f"of groups, each a list of ranks (whole numbers) ({describe_exception(exc)})")
    except ValueError as exc:
        return (f"for {layout}, your {dim} groups {_short(groups)} hold {exc}: every rank is "
                f"in exactly one {dim} group")
    counts = collections.Counter(r for group in groups for r in group)
    strangers = sorted(r for r in counts if not 0 <= r < size)
    missing = sorted(set(range(size)) - set(counts))
    twice = sorted(r for r, count in counts.items() if count > 1)
    if strangers or missing or twice:
        what = (f"name rank(s) {strangers}, not among its {size} ranks" if strangers else
                f"leave out rank(s) {missing}" if missing else
                f"put rank(s) {twice} in more than one group")
        return (f"for {layout}, your {dim} groups {_short(groups)} {what}: every rank is in "
                f"exactly one {dim} group")
    return groups


def _well_formed(rows, pairs: int) -> bool:
    """Whether a rank's report has the shape ``_on_rank`` gives it."""
    return isinstance(rows, list) and len(rows) == pairs and all(
        isinstance(row, tuple) and len(row) == 2 and (row[1] is None or (
            isinstance(row[1], list) and all(type(r) is int for r in row[1]))) for row in rows)


def _judge(values, layouts: list[Layout], drawn: list[Layout]) -> CheckResult:
    world_size, pairs = len(values), _pairs(layouts) + _pairs(drawn)
    if not all(_well_formed(rows, len(pairs)) for rows in values):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")
    for rank, rows in enumerate(values):
        for (layout, dim), (mine, real) in zip(pairs, rows, strict=True):
            expected = layout.groups(dim)  # the grid's groups, computed here
            mine = _judge_groups(str(layout), dim, mine, layout.size)
            if isinstance(mine, str):
                return failed(EXERCISE, mine, [HINT])
            if real is None:  # a drawn layout: every rank of it is judged here
                wrong = _first_wrong(mine, expected)
                if wrong is not None:
                    r, grid, yours = wrong
                    return failed(EXERCISE, f"for {layout} (a layout of {layout.size} ranks "
                                  f"drawn for this run), rank {r}'s {dim} group on a "
                                  f"DeviceMesh is {grid}, yours is {yours}", [HINT],
                                  layout=str(layout), dim=dim, rank=r, real=grid, yours=yours)
                continue
            grid = next(g for g in expected if rank in g)
            yours = next(sorted(g) for g in mine if rank in g)
            if yours != grid:
                return failed(EXERCISE, f"for {layout}, rank {rank}'s {dim} group on the real "
                              f"DeviceMesh is {grid}, yours is {yours}", [HINT],
                              layout=str(layout), dim=dim, rank=rank, real=grid, yours=yours)
            if real != grid:
                return failed(EXERCISE, f"rank {rank} reported its {dim} group on the "
                              f"DeviceMesh of {layout} as {real}, the layout's grid gives "
                              f"{grid}: its code on that rank changed the check's measurements")
    checked = sorted({(str(layout), dim) for layout, dim in _pairs(layouts)})
    return passed(EXERCISE, f"every rank's group matches PyTorch's DeviceMesh for "
                  f"{len(checked)} (layout, dimension) pairs on {world_size} ranks",
                  [f"{layout}: {dim}" for layout, dim in checked]
                  + [f"and every group of {len(drawn)} layouts drawn for this run: "
                     + ", ".join(str(layout) for layout in drawn)])


def _first_wrong(mine: list[list[int]], expected: list[list[int]]):
    """(rank, its group on the grid, its group in ``mine``) for the first rank whose groups
    differ; None if every rank's are the same."""
    for group in expected:
        for r in group:
            yours = next(sorted(g) for g in mine if r in g)
            if yours != group:
                return r, group, yours
    return None


def mesh_groups(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Run ``fn`` on every rank for the layouts of this rank count and compare each rank's
    group with the real mesh's; then again at a second rank count."""

    def once() -> CheckResult:
        n = cluster.world_size
        layouts = LAYOUTS.get(n)
        if layouts is None:
            return failed(EXERCISE, f"this check runs on 2, 4 or 8 ranks, not {n}: resize the "
                          "cluster")
        drawn = drawn_layouts(fresh_seed())
        outcome = run_checked(cluster, EXERCISE, WHERE, _on_rank, fn, layouts, drawn,
                              timeout=timeout)
        return outcome.verdict or _judge(outcome.values, layouts, drawn)

    return at_two_sizes(cluster, once)
