"""One resolved run: a ``TrainConfig``, its layout and its engines, checked once.

    run = resolve(config, world_size=4, device_type="cpu", backend="gloo")
    run.layout            # Layout(fsdp=2, tp=2): the degrees
    run.engines           # Engines(schedule=None, dp_kind="fsdp", tables=None, cp_engine=None)

``resolve`` is the only place a run is worked out and validated: the layout (the config's
own, or its strategy's preset), the engine each dimension runs with its default filled in
("1f1b" for a pipeline, "fsdp" over fsdp > 1, the cp engine for the device), and every rule
that ties fields together (``labkit/training/rules.py``: the layout against the ranks, the
model, the batch, the levers and the device). Fields check their own type and range where
they are declared (``TrainConfig``, ``Layout``).

Everything after it reads the ``Run``: ``labkit.train`` and the checkpoint rules in the
notebook, the estimator, ``torchrun``, the report, and every rank, which receives
``run.to_dict()`` and rebuilds it with ``Run.from_dict`` without checking it again (as
torchtitan builds its ``ParallelDims`` once from the job config and passes it everywhere).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.parallel.context.engine import resolve_engine
from labkit.training.config import TrainConfig
from labkit.training.layout.layout import DEFAULT_SCHEDULE, Layout
from labkit.training.layout.presets import preset
from labkit.training.rules import (
    check_debug_env,
    check_engine_choices,
    check_fields,
    check_run,
)


@dataclass(frozen=True)
class Engines:
    """What runs each dimension of a layout, every default filled in.

    Attributes:
        schedule: the pipeline schedule that runs ("naive", "gpipe", "1f1b",
            "interleaved_1f1b"), or None without a pipeline.
        dp_kind: the data-parallel engine ("ddp", "naive", "zero1", "fsdp"), or None (one
            replica, no engine; or the DLRM's tables, which average by hand).
        tables: the DLRM's table placement over fsdp, or None.
        cp_engine: what runs context parallelism ("ring", "torch"), or None when cp = 1.
    """

    schedule: str | None = None
    dp_kind: str | None = None
    tables: str | None = None
    cp_engine: str | None = None

    @property
    def pipelined(self) -> bool:
        return self.schedule is not None

    @property
    def stages_per_rank(self) -> int:
        return 2 if self.schedule == "interleaved_1f1b" else 1

    @property
    def data_engine(self) -> str | None:
        """The data-parallel engine that runs: "ddp", "naive", "zero1", "fsdp", "tables"
        (the DLRM's tables over fsdp, its dense part averaged by hand) or None."""
        return "tables" if self.tables is not None else self.dp_kind

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Run:
    """A run, resolved: what to train, its degrees, its engines and where it runs.

    Made by :func:`resolve` (checked) or :meth:`from_dict` (on the ranks: not checked again).
    """

    config: TrainConfig
    layout: Layout
    engines: Engines
    world_size: int
    device_type: str = "cpu"
    backend: str = "gloo"

    @property
    def label(self) -> str:
        return self.config.label

    @property
    def stages(self) -> int:
        """Pipeline stages over all the ranks (pp x stages per rank), 1 without a pipeline."""
        return self.layout.pp * self.engines.stages_per_rank if self.engines.pipelined else 1

    def replace(self, **changes) -> Run:
        """A copy with ``changes`` (unchecked: for the estimator's own tracing run)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        return {"config": self.config.to_dict(), "layout": dataclasses.asdict(self.layout),
                "engines": self.engines.to_dict(), "world_size": self.world_size,
                "device_type": self.device_type, "backend": self.backend}

    @classmethod
    def from_dict(cls, data: dict) -> Run:
        """The run ``to_dict`` sent: rebuilt as it was resolved, without the checks."""
        return cls(TrainConfig.from_dict(data["config"]), Layout(**data["layout"]),
                   Engines(**data["engines"]), data["world_size"], data["device_type"],
                   data["backend"])


def _layout(config: TrainConfig, world_size: int) -> Layout:
    return config.layout if config.layout is not None else preset(config.strategy, world_size)


def _engines(config: TrainConfig, layout: Layout, device_type: str) -> Engines:
    pipelined = layout.pp > 1 or layout.schedule is not None
    schedule = (layout.schedule or DEFAULT_SCHEDULE) if pipelined else None
    dp_kind = layout.dp_kind
    if dp_kind is None and layout.tables is None:
        dp_kind = "fsdp" if layout.fsdp > 1 else ("ddp" if layout.dp > 1 else None)
    cp_engine = resolve_engine(config.cp_engine, device_type) if layout.cp > 1 else None
    return Engines(schedule, dp_kind, layout.tables, cp_engine)


def resolve(config: TrainConfig, world_size: int, device_type: str = "cpu",
            backend: str = "gloo", debug: str | None = None) -> Run:
    """The run ``config`` trains on ``world_size`` ranks of ``device_type`` talking over
    ``backend``, checked: ValueError (saying what to change) for anything that cannot run.
    ``debug``: the ``TORCH_DISTRIBUTED_DEBUG`` the ranks will inherit (its DETAIL level
    crashes DDP over gloo)."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"resolve takes a labkit.TrainConfig, not {config!r}")
    check_fields(config)
    layout = _layout(config, world_size)
    check_engine_choices(layout)
    engines = _engines(config, layout, device_type)
    run = Run(config, layout, engines, world_size, device_type, backend)
    check_run(run)
    check_debug_env(run, debug)
    return run
