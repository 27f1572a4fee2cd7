"""Notebook 06's exercise: place whole embedding tables on ranks under a memory cap.

The learner writes ``place_tables(table_bytes, world_size, capacity_bytes)`` returning, for
each rank, the list of tables (indices) it holds whole; ``table_bytes`` is each table's cost
in training (weights, gradients and Adam's two moments). The check calls it on every rank for
a few fixed sets of tables and one drawn for each run (so no table of answers passes), then
each rank really holds what it was given: it allocates the training state of its tables under
the cap, with the suite's memory tracker, so a placement that does not fit raises
``DeviceOOM`` on that rank, as a GPU would. The ranks return the placements and what they
held; the check, in its own process, judges each placement and adds up the bytes each rank's
tables need (what the rank measured is its word, beside it). The suite's planner
(``labkit.parallel.embedding.plan_tables``) gives its verdict on each set beside it.
"""

from __future__ import annotations

import math
import operator
import random

import torch

from labkit.lessons.exercise.outside import fresh_seed
from labkit.lessons.exercise.result import CheckResult, failed, passed
from labkit.lessons.exercise.runner import at_two_sizes, run_checked
from labkit.parallel.embedding.placement import PlacementError, plan_tables
from labkit.runtime.memory import DeviceOOM, format_bytes

EXERCISE = "place_tables"
UNIT = 64 * 1024  # bytes: the tables are small, the packing problem is the same at any size


def cases(world_size: int) -> list[tuple[list[int], int]]:
    """(table_bytes, capacity) sets that largest-first-onto-the-least-loaded fits and that each
    shortcut fails on some set, for any N >= 2: filling rank 0 first (the first set), dealing
    tables round-robin (the second and the last), least-loaded in the given order without
    sorting (the last), contiguous blocks of tables (all). The third fills every rank exactly."""
    n, half = world_size, math.ceil(world_size / 2)
    return [([UNIT] * (2 * n) + [4 * UNIT] * n, 6 * UNIT),
            ([4 * UNIT, UNIT] * n + [UNIT] * n, 6 * UNIT),
            ([3 * UNIT] * n + [2 * UNIT] * n + [UNIT] * n, 6 * UNIT),
            ([UNIT] * (2 * half) + [2 * UNIT] * (n - half), 2 * UNIT)]


def drawn_case(seed: int, world_size: int) -> tuple[list[int], int]:
    """A set of tables from ``seed`` (n+1 to 3n tables of 1 to 4 units) and a cap that any
    placement of each table onto the least-loaded rank meets: the mean load plus the
    largest table (Graham's bound for greedy list scheduling)."""
    pick = random.Random(seed)
    tables = [UNIT * pick.randint(1, 4) for _ in range(pick.randint(world_size + 1,
                                                                     3 * world_size))]
    return tables, math.ceil(sum(tables) / world_size / 16) * 16 + max(tables)


def _hold(ctx, tables: list[int], table_bytes: list[int], capacity: int) -> int:
    """Allocate this rank's tables' training state (4 tensors each) under ``capacity``."""
    tracker = ctx.memory
    saved = tracker.capacity_bytes
    with tracker:
        base = tracker.live()["total"]
        tracker.capacity_bytes = base + capacity
        held = []
        try:
            for table in tables:  # weights, gradients, Adam's two moments: a quarter each
                held += [torch.empty(table_bytes[table] // 16, dtype=torch.float32,
                                     device=ctx.device) for _ in range(4)]
            return tracker.live()["total"] - base
        finally:
            tracker.capacity_bytes = saved
            del held


def _job(ctx, fn, sets) -> list[dict]:
    out = []
    for table_bytes, capacity in sets:
        placement = fn(list(table_bytes), ctx.world_size, capacity)
        entry = {"placement": placement, "held": None, "oom": None}
        try:
            found = _as_placement(placement, len(table_bytes), ctx.world_size)
            mine = found[ctx.rank] if not isinstance(found, str) else []
            entry["held"] = _hold(ctx, mine, table_bytes, capacity)
        except DeviceOOM as oom:
            entry["oom"] = oom.to_dict()
        out.append(entry)
    return out


def _as_placement(placement, tables: int, world_size: int) -> list[list[int]] | str:
    """``placement`` as ``world_size`` lists of table indices (ints), each of the ``tables``
    once; else what is wrong with it. An index is a whole number (an int, or an integer
    tensor of one element: ``operator.index``), never a float."""
    if not isinstance(placement, (list, tuple)) or len(placement) != world_size or not all(
            isinstance(mine, (list, tuple)) for mine in placement):
        return (f"place_tables must return one list of table indices per rank ({world_size} "
                f"lists), got {placement!r}"[:300])
    wrong = (f"every table (an index, 0 to {tables - 1}) must be on exactly one rank; the "
             f"placement was {placement!r}"[:300])
    if sum(len(mine) for mine in placement) != tables:
        return wrong
    try:
        found = [[operator.index(t) for t in mine] for mine in placement]
    except TypeError:
        return wrong
    return found if sorted(t for mine in found for t in mine) == list(range(tables)) else wrong


def _planner(table_bytes, world_size, capacity) -> str:
    try:
        plan = plan_tables(table_bytes, world_size, capacity)
    except PlacementError as error:
        return f"the planner finds no placement: {error}"
    return (f"the planner's {plan.method} placement {plan.tables_per_rank} fits "
            f"({', '.join(format_bytes(b) for b in plan.rank_bytes)} per rank)")


def place_tables(cluster, fn, timeout: float | None = None) -> CheckResult:
    """Check ``fn(table_bytes, world_size, capacity_bytes)`` on every rank of ``cluster`` (at
    its rank count, then at a second one)."""
    return at_two_sizes(cluster, lambda: _check(cluster, fn, timeout))


def _well_formed(rank_sets, count: int) -> bool:
    """Whether a rank's report has the shape ``_job`` gives it (a rank's code may change it)."""
    return isinstance(rank_sets, list) and len(rank_sets) == count and all(
        isinstance(e, dict) and {"placement", "held", "oom"} <= set(e)
        and (e["held"] is None or isinstance(e["held"], int))
        and (e["oom"] is None or isinstance(e["oom"], dict)) for e in rank_sets)


def _check(cluster, fn, timeout: float | None) -> CheckResult:
    n = cluster.world_size
    sets = cases(n) + [drawn_case(fresh_seed(), n)]
    outcome = run_checked(cluster, EXERCISE, "place_tables", _job, fn, sets, timeout=timeout)
    if outcome.verdict:
        return outcome.verdict
    if not all(_well_formed(rank_sets, len(sets)) for rank_sets in outcome.values):
        return failed(EXERCISE, "a rank sent back a report that labkit's check does not "
                      "write: its code on that rank changed the check's measurements")
    problems, details, shown = [], [], []  # shown: rank 0's placements, as ints (or None)
    for k, (table_bytes, capacity) in enumerate(sets):
        entries = [rank_cases[k] for rank_cases in outcome.values]
        sizes = ", ".join(format_bytes(b) for b in table_bytes)
        where = f"tables of {sizes} on {n} ranks of {format_bytes(capacity)}"
        found = [_as_placement(e["placement"], len(table_bytes), n) for e in entries]
        placement = found[0]
        shown.append(None if isinstance(placement, str) else placement)
        if isinstance(placement, str):
            problems.append(f"{placement} ({where})")
            continue
        if any(other != placement for other in found):
            problems.append(f"the ranks computed different placements for {where}: make the "
                            "placement depend only on the arguments")
            continue
        for rank, entry in enumerate(entries):
            need = sum(table_bytes[t] for t in placement[rank])  # counted here
            if need > capacity and not entry["oom"]:
                problems.append(f"rank {rank}'s tables {placement[rank]} need "
                                f"{format_bytes(need)}, more than the cap "
                                f"{format_bytes(capacity)} for {where}, yet the rank "
                                "reported holding them: its code on that rank changed the "
                                "check's measurements")
            elif entry["oom"]:
                problems.append(f"rank {rank} ran out of memory holding tables "
                                f"{placement[rank]} ({format_bytes(need)}, cap "
                                f"{format_bytes(capacity)}) for {where}; "
                                f"{_planner(table_bytes, n, capacity)}: place the largest "
                                "tables first, each on the least-loaded rank")
        details.append(f"{where}: {placement}, measured per rank "
                       + ", ".join(format_bytes(e['held']) if e['held'] is not None
                                   else 'out of memory' for e in entries))
    measured = {"placements": [shown]}
    if problems:
        return failed(EXERCISE, problems[0], problems[1:] + details, **measured)
    return passed(EXERCISE, f"every placement held under the cap on every rank "
                  f"({len(details)} sets of tables).", details, **measured)
