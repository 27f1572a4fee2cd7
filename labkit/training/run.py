"""One resolved run: a ``TrainConfig``, its layout and its engines, checked once.

    run = resolve(config, world_size=4, device_type="cpu", backend="gloo")
    run.layout            # Layout(fsdp=2, tp=2): the degrees (``labkit/training/layout``)
    run.engines           # Engines(dp_kind="fsdp"): what runs them (``engines.py``)

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
from dataclasses import dataclass, field

from labkit.parallel.context.engine import resolve_engine
from labkit.training.config import TrainConfig
from labkit.training.engines import CHOICE_FIELDS, Engines, engines_for
from labkit.training.layout.layout import Layout
from labkit.training.layout.presets import preset
from labkit.training.profile import check_profile_dir
from labkit.training.rules import (
    check_debug_env,
    check_engine_choices,
    check_fields,
    check_run,
)


@dataclass(frozen=True)
class Run:
    """A run, resolved: what to train, its degrees, its engines and where it runs.

    Made by :func:`resolve` (checked: ``checked`` is True) or :meth:`from_dict` (on the
    ranks: not checked again). A copy (``replace``, ``dataclasses.replace``) is unchecked,
    and ``labkit.train`` refuses it.
    """

    config: TrainConfig
    layout: Layout
    engines: Engines
    world_size: int
    device_type: str = "cpu"
    backend: str = "gloo"
    # set by resolve alone: a copy (dataclasses.replace, from_dict) is not a checked run
    checked: bool = field(default=False, init=False, compare=False, repr=False)

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


def layout_and_choices(config: TrainConfig, world_size: int
                       ) -> tuple[Layout, dict[str, str]]:
    """The config's layout and engine choices, or its strategy's preset."""
    if config.layout is None:
        return preset(config.strategy, world_size)
    choices = {name: getattr(config, name) for name in CHOICE_FIELDS}
    return config.layout, {name: value for name, value in choices.items() if value is not None}


def resolve(config: TrainConfig, world_size: int, device_type: str = "cpu",
            backend: str = "gloo", debug: str | None = None) -> Run:
    """The run ``config`` trains on ``world_size`` ranks of ``device_type`` talking over
    ``backend``, checked: ValueError (saying what to change) for anything that cannot run.
    ``debug``: the ``TORCH_DISTRIBUTED_DEBUG`` the ranks will inherit (its DETAIL level
    crashes DDP over gloo)."""
    if not isinstance(config, TrainConfig):
        raise TypeError(f"resolve takes a labkit.TrainConfig, not {config!r}")
    check_fields(config)
    if config.profile is not None:  # the folder every rank writes its trace to, made now
        config = config.replace(profile=check_profile_dir(config.profile))
    layout, choices = layout_and_choices(config, world_size)
    check_engine_choices(layout, **choices)
    cp_engine = resolve_engine(config.cp_engine, device_type) if layout.cp > 1 else None
    engines = engines_for(layout, **choices, cp_engine=cp_engine)
    run = Run(config, layout, engines, world_size, device_type, backend)
    check_run(run)
    check_debug_env(run, debug)
    object.__setattr__(run, "checked", True)
    return run
