"""DDP vs ZeRO-1 vs FSDP on the same model as the device count grows: measured memory per
rank beside the estimate, and what each pays in communication."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from labkit.models import count_parameters
from labkit.runtime.memory.oom import CATEGORIES
from labkit.training.api import train
from labkit.training.sweep import run_cells


@dataclass
class ShardingRow:
    """One measured run: a strategy on ``world_size`` ranks."""

    strategy: str
    world_size: int
    peak_bytes: int  # the highest rank's measured peak
    at_peak: dict[str, int]  # that rank's bytes by category at its peak
    estimated_bytes: int
    comm_kinds: dict[str, list]  # kind -> [calls, tensor bytes, bytes sent per rank] per step
    comm_bytes: int  # the tensors the collectives worked on
    comm_wire_bytes: float  # what a ring sends per rank for them
    step_s: float
    comm_s: float  # exposed communication in the median step
    comm_busy_s: float
    oversubscribed: bool
    losses: list[float] = field(default_factory=list)

    @property
    def estimate_error(self) -> float:
        return abs(self.estimated_bytes - self.peak_bytes) / self.peak_bytes


@dataclass
class ShardingComparison:
    model: str
    params: int
    global_batch: int
    rows: list[ShardingRow] = field(default_factory=list)

    @property
    def strategies(self) -> list[str]:
        return list(dict.fromkeys(r.strategy for r in self.rows))

    @property
    def world_sizes(self) -> list[int]:
        return sorted({r.world_size for r in self.rows})

    def row(self, strategy: str, world_size: int) -> ShardingRow:
        return next(r for r in self.rows
                    if r.strategy == strategy and r.world_size == world_size)

    def loss_gaps(self, world_size: int, reference: str = "ddp") -> dict[str, float]:
        """Largest per-step loss difference of each strategy from ``reference``: sharding
        changes where the state lives, not the training."""
        want = self.row(reference, world_size).losses
        return {r.strategy: max(abs(a - b) for a, b in zip(r.losses, want, strict=True))
                for r in self.rows if r.world_size == world_size and r.strategy != reference}

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> list[dict]:
        """One plain dict per run, with its estimate error (what a notebook records)."""
        return [asdict(row) | {"estimate_error": row.estimate_error} for row in self.rows]


def _row(report) -> ShardingRow:
    highest = max(report.ranks, key=lambda r: r["memory"]["peak_bytes"])
    split = report.split()
    last = report.ranks[0]["records"][-1]
    return ShardingRow(report.config.label, report.world_size,
                       highest["memory"]["peak_bytes"],
                       {c: highest["memory"]["at_peak"][c] for c in CATEGORIES},
                       report.estimate["peak_bytes"], last["comm_kinds"], last["comm_bytes"],
                       last["comm_wire_bytes"],
                       split["step_s"], split["comm_s"], split["comm_busy_s"],
                       report.oversubscribed, report.losses)


def compare_sharding(cluster, config, strategies=("ddp", "zero1", "fsdp"),
                     world_sizes=(1, 2, 4)) -> ShardingComparison:
    """Train ``config`` (a TrainConfig) with every strategy on every world size (the cluster
    is resized as needed, and put back), measuring memory, traffic and time. Every cell is
    checked before the first one runs."""
    cells = [(n, config.replace(strategy=name)) for n in sorted(world_sizes)
             for name in strategies]
    reports = run_cells(cluster, cells, train)
    return ShardingComparison(config.model.name, count_parameters(config.model),
                              config.global_batch, [_row(r) for r in reports])
