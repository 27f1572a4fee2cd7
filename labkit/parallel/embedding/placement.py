"""Where each embedding table goes: a sharding planner in the spirit of TorchRec's.

A table costs a rank far more than its weights while it trains: its gradient is as big
(``nn.Embedding`` makes a dense one) and Adam keeps two more tensors of that size. The planner
counts that full training cost, keeps a reserve on every rank for the dense part and the lookups
in flight, and then:

1. a table that fits no rank whole is split by rows over all ranks (row-wise);
2. the others are placed whole, largest first, each on the least-loaded rank (greedy
   "longest processing time first", which balances memory well);
3. if greedy leaves a table without a rank but the count is small, an exact search over
   placements finds one when one exists;
4. if no whole placement exists, the largest whole table is made row-wise and 2-3 repeat;
5. if even every table row-wise does not fit, ``PlacementError`` says what would.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from labkit.runtime.memory.units import format_bytes

EXACT_SEARCH_MAX_TABLES = 12  # exact search is exponential: only for a few tables
EXACT_SEARCH_MAX_NODES = 200_000


class PlacementError(ValueError):
    """No placement keeps every rank under its capacity."""


@dataclass
class TablePlan:
    """A placement of tables on ranks.

    Attributes:
        world_size: ranks.
        table_bytes: each table's training cost (weights + gradients + optimizer state).
        tables_per_rank: the whole tables each rank holds (table indices).
        row_wise: tables split by rows over every rank.
        row_wise_share: for each of them, its bytes on the fullest rank.
        rank_bytes: each rank's planned bytes for tables (whole ones + row-wise shards).
        reserved_bytes: per rank, kept free for the dense part and lookups (an estimate).
        capacity_bytes: the cap planned for (None: no cap, balance only).
        method: "greedy", "exact search" or "row-wise" (every table split).
        why: the planner's reasons, in words.
    """

    world_size: int
    table_bytes: list[int]
    tables_per_rank: list[list[int]]
    row_wise: list[int]
    row_wise_share: list[int]
    rank_bytes: list[int]
    reserved_bytes: int = 0
    capacity_bytes: int | None = None
    method: str = "greedy"
    why: list[str] = field(default_factory=list)

    def owner(self, table: int) -> int | None:
        """The rank that holds ``table`` whole (None for a row-wise table)."""
        for rank, tables in enumerate(self.tables_per_rank):
            if table in tables:
                return rank
        return None

    @property
    def whole_tables(self) -> list[int]:
        return sorted(t for tables in self.tables_per_rank for t in tables)

    @property
    def total_bytes(self) -> list[int]:
        """Planned bytes per rank, reserve included."""
        return [b + self.reserved_bytes for b in self.rank_bytes]

    @property
    def fits(self) -> bool:
        return self.capacity_bytes is None or max(self.total_bytes) <= self.capacity_bytes

    def explain(self) -> str:
        return "\n".join(self.why)

    def to_dict(self) -> dict:
        return {**self.__dict__, "total_bytes": self.total_bytes, "fits": self.fits}

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{r}</td><td>{', '.join(map(str, t)) or '-'}</td>"
            f"<td>{format_bytes(self.total_bytes[r])}</td></tr>"
            for r, t in enumerate(self.tables_per_rank))
        split = ", ".join(map(str, self.row_wise)) or "none"
        reasons = "".join(f"<li>{line}</li>" for line in self.why)
        return (f"<b>table placement on {self.world_size} ranks ({self.method}); row-wise: "
                f"{split}</b><table><tr><th>rank</th><th>whole tables</th><th>planned bytes"
                f"</th></tr>{rows}</table><ul>{reasons}</ul>")


def row_shard_bytes(nbytes: int, rows: int, world_size: int) -> int:
    """The largest rank's share of a table split by rows (``torch.chunk``: ceil(rows / N))."""
    return math.ceil(rows / world_size) * nbytes // rows


def _greedy(costs: dict[int, int], loads: list[int], budget: float) -> list[list[int]] | None:
    """Largest first onto the least-loaded rank; None when a table fits no rank."""
    loads, placed = list(loads), [[] for _ in loads]
    for table in sorted(costs, key=lambda t: (-costs[t], t)):
        rank = min(range(len(loads)), key=lambda r: (loads[r], r))
        if loads[rank] + costs[table] > budget:
            return None
        loads[rank] += costs[table]
        placed[rank].append(table)
    return placed


def _exact(costs: dict[int, int], loads: list[int], budget: float) -> list[list[int]] | None:
    """Depth-first search over placements (largest table first; ranks with equal loads are
    interchangeable, so only one of them is tried); the first placement under budget."""
    order = sorted(costs, key=lambda t: (-costs[t], t))
    loads, placed, nodes = list(loads), [[] for _ in loads], [0]

    def place(i: int) -> bool:
        if i == len(order):
            return True
        nodes[0] += 1
        if nodes[0] > EXACT_SEARCH_MAX_NODES:
            return False
        tried = set()
        for rank in sorted(range(len(loads)), key=lambda r: (loads[r], r)):
            if loads[rank] in tried or loads[rank] + costs[order[i]] > budget:
                continue
            tried.add(loads[rank])
            loads[rank] += costs[order[i]]
            placed[rank].append(order[i])
            if place(i + 1):
                return True
            loads[rank] -= costs[order[i]]
            placed[rank].pop()
        return False

    return placed if place(0) else None


def _no_fit(shares: int, world_size: int, reserved_bytes: int, capacity_bytes: int) -> str:
    """Why nothing fits, and how many ranks would: the tables' bytes split N ways must fit
    what each rank has left after the part of the model that every rank keeps whole."""
    needed = shares + reserved_bytes
    text = (f"the tables need {format_bytes(needed)} per rank even split by rows over "
            f"{world_size} ranks, and the cap is {format_bytes(capacity_bytes)}")
    room = capacity_bytes - reserved_bytes
    if room <= 0:
        return (f"{text}: the dense part alone ({format_bytes(reserved_bytes)}) fills a rank, "
                "so no rank count helps: raise memory_per_device or shrink the model")
    ranks = math.ceil(shares * world_size / room)
    return (f"{text}: add ranks (about {ranks}), raise memory_per_device, or use smaller "
            "tables")


def plan_tables(table_bytes: list[int], world_size: int, capacity_bytes: int | None = None,
                reserved_bytes: int = 0, table_rows: list[int] | None = None) -> TablePlan:
    """Place tables of training cost ``table_bytes`` (weights + gradients + optimizer state)
    on ``world_size`` ranks of ``capacity_bytes`` each, ``reserved_bytes`` of which go to the
    rest of the model. ``table_rows`` (for exact row-wise shares) defaults to one row per byte.
    Raises ``PlacementError`` when even splitting every table by rows does not fit."""
    n, rows = world_size, table_rows or list(table_bytes)
    budget = math.inf if capacity_bytes is None else capacity_bytes - reserved_bytes
    cap_text = "no cap" if capacity_bytes is None else f"cap {format_bytes(capacity_bytes)}"
    why = [f"{len(table_bytes)} tables, {format_bytes(sum(table_bytes))} to train (weights, "
           f"gradients, optimizer state) on {n} ranks, {cap_text}, "
           f"{format_bytes(reserved_bytes)} per rank kept for the dense part and lookups."]
    row_wise = sorted(t for t, b in enumerate(table_bytes) if b > budget)
    for t in row_wise:
        why.append(f"table {t} ({format_bytes(table_bytes[t])}) fits no rank whole: split by "
                   f"rows, {format_bytes(row_shard_bytes(table_bytes[t], rows[t], n))} per rank.")
    method = "greedy"
    while True:
        shares = sum(row_shard_bytes(table_bytes[t], rows[t], n) for t in row_wise)
        if shares > budget:
            raise PlacementError(_no_fit(shares, n, reserved_bytes, capacity_bytes))
        costs = {t: b for t, b in enumerate(table_bytes) if t not in row_wise}
        placed = _greedy(costs, [shares] * n, budget)
        if placed is None and len(costs) <= EXACT_SEARCH_MAX_TABLES:
            placed = _exact(costs, [shares] * n, budget)
            if placed is not None:
                method = "exact search"
                why.append("largest-first on the least-loaded rank left a table without room;"
                           " an exact search over placements found one that fits.")
        if placed is not None:
            break
        largest = max(costs, key=lambda t: (costs[t], -t))
        row_wise = sorted([*row_wise, largest])
        why.append(f"no placement of whole tables fits: table {largest} "
                   f"({format_bytes(table_bytes[largest])}) is split by rows instead.")
    if costs and method == "greedy":
        why.append("whole tables placed largest first, each on the least-loaded rank, so "
                   "that memory is balanced.")
    if len(row_wise) == len(table_bytes):
        method = "row-wise"
    rank_bytes = [shares + sum(table_bytes[t] for t in tables) for tables in placed]
    return TablePlan(n, list(table_bytes), [sorted(t) for t in placed], row_wise,
                     [row_shard_bytes(table_bytes[t], rows[t], n) for t in row_wise],
                     rank_bytes, reserved_bytes, capacity_bytes, method, why)


def all_row_wise(table_bytes: list[int], world_size: int, table_rows: list[int],
                 reserved_bytes: int = 0, capacity_bytes: int | None = None,
                 reason: str = "row-wise sharding asked for") -> TablePlan:
    """The plan of row-wise sharding: every table's rows split over all ranks."""
    shares = [row_shard_bytes(b, r, world_size)
              for b, r in zip(table_bytes, table_rows, strict=True)]
    cap_text = "no cap" if capacity_bytes is None else f"cap {format_bytes(capacity_bytes)}"
    reason = (f"{reason}: every one of the {len(table_bytes)} tables "
              f"({format_bytes(sum(table_bytes))} to train) is split by rows over {world_size} "
              f"ranks, {format_bytes(sum(shares))} per rank, plus "
              f"{format_bytes(reserved_bytes)} kept for the dense part and lookups ({cap_text}).")
    return TablePlan(world_size, list(table_bytes), [[] for _ in range(world_size)],
                     list(range(len(table_bytes))), shares, [sum(shares)] * world_size,
                     reserved_bytes, capacity_bytes, "row-wise", [reason])

