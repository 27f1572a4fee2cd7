"""When tensor parallelism pays, measured: its traffic beside data parallelism's.

Tensor parallelism AllReduces *activations* in every split layer, forward and backward: its
bytes per step grow with batch x width x layers. DDP AllReduces the *gradients* once per
step: its bytes are the parameters', whatever the batch. So TP's traffic overtakes DDP's
past some batch size, and on real hardware TP is kept to the fastest links (inside one
machine); in exchange it splits the weights, which DDP never does.

    result = compare_with_ddp(cluster, config, batches=[32, 256, 1024])
    labkit.plots.plot_tp_vs_ddp(result)
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.models import count_parameters, plan_for
from labkit.training.api import train
from labkit.training.config import TrainConfig
from labkit.training.sweep import run_cells


def check_tp_degree(model_config, degree: int) -> None:
    """Raise ValueError, before any process starts, if tensor parallelism cannot split
    ``model_config``'s layers evenly over ``degree`` ranks (the model's plan says)."""
    if degree < 1:
        raise ValueError(f"a tensor-parallel degree must be at least 1, not {degree}")
    plan = plan_for(model_config)
    if not plan.splits_tensors:
        raise ValueError(f"tensor parallelism here splits the zoo's 'mlp' and 'gpt', not "
                         f"{plan.family!r}")
    plan.check_tp(model_config, degree)


@dataclass
class TPvsDDP:
    """Measured per-step communication and time of ``tp`` and ``ddp`` at several global
    batches, on the same model and ranks. ``rows``: one dict per (strategy, batch)."""

    model: str
    params: int
    world_size: int
    device: str
    oversubscribed: bool
    rows: list[dict]

    def series(self, strategy: str, key: str) -> list:
        return [row[key] for row in self.rows if row["strategy"] == strategy]

    @property
    def batches(self) -> list[int]:
        return self.series("tp", "batch")

    def crossover(self) -> float | None:
        """The batch at which TP's bytes per step reach DDP's, extrapolated from the
        measured slope (TP's bytes are proportional to the batch); None without traffic."""
        tp, ddp = self.series("tp", "bytes"), self.series("ddp", "bytes")
        per_sample = tp[-1] / self.batches[-1]
        return ddp[-1] / per_sample if per_sample else None


def _row(report, strategy: str, batch: int) -> dict:
    split = report.split()
    last = report.ranks[0]["records"][-1]
    return {"strategy": strategy, "batch": batch, "bytes": last["comm_bytes"],
            "calls": last["comm_calls"], "step_s": split["step_s"],
            "compute_s": split["compute_s"], "comm_s": split["comm_s"],
            "comm_busy_s": split["comm_busy_s"], "peak_bytes": max(report.peak_bytes)}


def compare_with_ddp(cluster, config: TrainConfig, batches=(32, 256, 1024)) -> TPvsDDP:
    """Train ``config``'s model with ``tp`` and with ``ddp`` on every rank of ``cluster`` at
    each global batch in ``batches``, without a memory cap (DDP holds the whole model on
    every rank); return the bytes, calls and time per step each measured."""
    world_size = cluster.world_size
    check_tp_degree(config.model, world_size)
    bad = [b for b in batches if b % world_size]
    if world_size < 2 or bad:
        raise ValueError(f"compare_with_ddp needs at least 2 ranks and batches that split "
                         f"over {world_size} ranks (not {bad})")
    cells = [(world_size, config.replace(strategy=strategy, global_batch=batch))
             for batch in sorted(batches) for strategy in ("tp", "ddp")]
    reports = run_cells(cluster, cells, lambda c, cell: train(
        c, cell, memory_per_device=None, estimate=False))
    rows = [_row(report, cell.strategy, cell.global_batch)
            for (_, cell), report in zip(cells, reports, strict=True)]
    return TPvsDDP(config.model.name, count_parameters(config.model), world_size,
                   cluster.device, cluster.oversubscribed, rows)
