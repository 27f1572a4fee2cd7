"""What a training run reports: per-rank records, summarised; saved and loaded as JSON."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from labkit.runtime.memory.oom import CATEGORIES
from labkit.runtime.memory.units import format_bytes
from labkit.training.config import TrainConfig
from labkit.training.engines import engines_for
from labkit.training.layout.layout import Layout
from labkit.training.run import Run, layout_and_choices
from labkit.training.step.record import StepRecord


def timed_steps(ranks: list[dict]) -> list[int]:
    """The steps a run's step time is taken from: not the first (lazy set-up), and those run
    without memory tracking when there are any (ranks track the same steps)."""
    later = list(range(1, len(ranks[0]["records"]))) or [0]
    untracked = [s for s in later
                 if not any(r["records"][s].get("memory_tracked", False) for r in ranks)]
    return untracked or later


@dataclass
class TrainReport:
    """A run: the resolved run (``run``: its config, layout, engines, rank count, device and
    backend), and every rank's records (``ranks[r]["records"]``: one dict per step,
    ``StepRecord.to_dict``), memory and, if asked, weights. Summaries below take the slowest
    rank at each step (it sets the pace)."""

    run: Run
    oversubscribed: bool
    ranks: list[dict]
    estimate: dict | None = None
    where: str = "measured here"
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        # which engine ran cp attention, said by the ranks: in the notebook and under torchrun
        if self.ranks and "cp_engine" in self.ranks[0]:
            self.extra.setdefault("cp_engine", self.ranks[0]["cp_engine"])

    # ----- the run ------------------------------------------------------------------------
    @property
    def config(self) -> TrainConfig:
        return self.run.config

    @property
    def layout(self) -> Layout:
        """The layout the run trained with (a strategy name's preset, resolved)."""
        return self.run.layout

    @property
    def world_size(self) -> int:
        return self.run.world_size

    @property
    def device(self) -> str:
        return self.run.device_type

    @property
    def backend(self) -> str:
        return self.run.backend

    @property
    def traces(self) -> list[str]:
        """Each rank's ``torch.profiler`` trace (``profile=DIR``), in rank order; [] without."""
        return [r["trace"] for r in self.ranks if "trace" in r]

    # ----- summaries (the slowest rank sets the pace of every step) -----------------------
    def records(self, rank: int = 0) -> list[StepRecord]:
        """Rank ``rank``'s steps as typed records."""
        return [StepRecord.from_dict(r) for r in self.ranks[rank]["records"]]

    def comm_by_dim(self, step: int = -1) -> dict[str, dict[str, dict]]:
        """Communication of one step by mesh dimension and collective, on every rank alike
        (rank 0's): {dimension: {collective: {"calls", "bytes", "wire_bytes", "seconds"}}}."""
        out: dict[str, dict[str, dict]] = {}
        for stat in self.records(0)[step].comm:
            out.setdefault(stat.dim, {})[stat.kind] = {
                "calls": stat.calls, "bytes": stat.bytes, "wire_bytes": stat.wire_bytes,
                "seconds": stat.seconds}
        return out

    @property
    def steps(self) -> int:
        return len(self.ranks[0]["records"])

    def _per_step(self, key: str, reduce=max) -> list[float]:
        return [reduce(r["records"][s][key] for r in self.ranks) for s in range(self.steps)]

    @property
    def losses(self) -> list[float]:
        """The global batch's loss per step: the mean of the ranks' equal-sized slices (in a
        pipeline only the last stage knows the loss; the others report NaN)."""
        return self._per_step("loss", lambda values: statistics.fmean(
            [v for v in values if not math.isnan(v)]))

    @property
    def step_s(self) -> list[float]:
        return self._per_step("step_s")

    @property
    def median_step_s(self) -> float:
        return self.split()["step_s"]

    def split(self) -> dict[str, float]:
        """The median step (of the slowest rank at each step), split into computation and
        exposed communication; the parts add up to the step time. Steps run without memory
        tracking are used when there are any; the first step (lazy set-up) is left out."""
        slowest = [max(self.ranks, key=lambda r: r["records"][s]["step_s"])["records"][s]
                   for s in timed_steps(self.ranks)]
        timed = sorted(slowest, key=lambda r: r["step_s"])
        median = timed[(len(timed) - 1) // 2]
        keys = ("step_s", "compute_s", "comm_s", "comm_busy_s", "forward_s", "backward_s",
                "optimizer_s")
        return {k: median[k] for k in keys}

    @property
    def samples_per_s(self) -> float:
        return self.config.global_batch / self.median_step_s

    @property
    def comm_bytes_per_step(self) -> int:
        return self.ranks[0]["records"][-1]["comm_bytes"]

    @property
    def peak_bytes(self) -> list[int]:
        return [r["memory"]["peak_bytes"] for r in self.ranks]

    def estimate_error(self) -> float | None:
        """|estimated - measured| / measured, for the rank with the highest measured peak."""
        if not self.estimate:
            return None
        measured = max(self.peak_bytes)
        return abs(self.estimate["peak_bytes"] - measured) / measured

    # ----- saving ------------------------------------------------------------------------
    def to_dict(self) -> dict:
        ranks = [{k: v for k, v in r.items() if k != "weights"} for r in self.ranks]
        return {"run": self.run.to_dict(), "oversubscribed": self.oversubscribed, "ranks": ranks,
                "estimate": self.estimate, "where": self.where, "extra": self.extra}

    @classmethod
    def from_dict(cls, data: dict) -> TrainReport:
        data = dict(data)
        data["run"] = Run.from_dict(data["run"]) if "run" in data else _saved_run(data)
        return cls(**data)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> TrainReport:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def _repr_html_(self) -> str:
        split = self.split()
        memory = self.ranks[0]["memory"]
        parts = ", ".join(f"{c} {format_bytes(memory['at_peak'][c])}" for c in CATEGORIES)
        note = " (oversubscribed: ranks share cores)" if self.oversubscribed else ""
        est = ""
        if self.estimate:
            est = (f"; estimated {format_bytes(self.estimate['peak_bytes'])} "
                   f"({100 * self.estimate_error():.1f}% off)")
        return (f"<b>{self.config.label} on {self.world_size} {self.device} ranks, "
                f"{self.where}{note}</b><br>loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}"
                f" in {self.steps} steps; step {split['step_s'] * 1e3:.1f} ms (compute "
                f"{split['compute_s'] * 1e3:.1f}, communication {split['comm_s'] * 1e3:.1f}); "
                f"{self.samples_per_s:.0f} samples/s<br>peak memory, rank 0: "
                f"{format_bytes(memory['peak_bytes'])} during {memory['peak_phase']} "
                f"({parts}){est}")


def _saved_run(data: dict) -> Run:
    """The run of a report saved before reports kept their resolved run (its config, rank
    count, device and backend at the top, the engine choices inside the layout): rebuilt
    as it ran, unchecked, the cp engine the one its ranks said (``extra["cp_engine"]``)."""
    config = TrainConfig.from_dict(data.pop("config"))
    world_size, device, backend = data.pop("world_size"), data.pop("device"), data.pop("backend")
    layout, choices = layout_and_choices(config, world_size)
    cp_engine = (data.get("extra") or {}).get("cp_engine", "ring") if layout.cp > 1 else None
    engines = engines_for(layout, **choices, cp_engine=cp_engine)
    return Run(config, layout, engines, world_size, device, backend)
