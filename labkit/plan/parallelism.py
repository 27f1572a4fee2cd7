"""What the planner projects: a layout's degrees and the engine choices that run them.

    Parallelism.of(dp=8, tp=4, pp=12, schedule="1f1b")
    Parallelism(labkit.Layout(fsdp=64), dp_kind="fsdp")

A training run keeps the two apart (``TrainConfig(layout=..., schedule=...)``, resolved into
``Run.layout`` and ``Run.engines``); a projection has no run, so this pairs them. It reads
as the layout it wraps (``.tp``, ``.size``, ``.groups("dp")``) and as its engines
(``.pipelined``, ``.data_engine``), with the defaults of ``labkit/training/engines.py``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.training.engines import Engines, check_choice, describe, engines_for
from labkit.training.layout.layout import Layout
from labkit.training.rules import check_engine_choices

_CHOICES = ("schedule", "dp_kind", "tables")


@dataclass(frozen=True)
class Parallelism:
    """A layout (degrees) and its engine choices (None: the default)."""

    layout: Layout
    schedule: str | None = None
    dp_kind: str | None = None
    tables: str | None = None

    def __post_init__(self):
        if not isinstance(self.layout, Layout):
            raise TypeError(f"Parallelism.layout is a labkit.Layout, not {self.layout!r}")
        for name in _CHOICES:
            check_choice("Parallelism", name, getattr(self, name))
        # the same engine rules a training run passes (zero1 over fsdp, fsdp without it...)
        check_engine_choices(self.layout, self.schedule, self.dp_kind, self.tables)

    @classmethod
    def of(cls, schedule: str | None = None, dp_kind: str | None = None,
           tables: str | None = None, **degrees: int) -> Parallelism:
        return cls(Layout(**degrees), schedule, dp_kind, tables)

    def __getattr__(self, name: str):
        """The layout's degrees and arithmetic (``tp``, ``size``, ``coordinates``...)."""
        if name.startswith("_") or name == "layout":
            raise AttributeError(name)
        return getattr(self.layout, name)

    @property
    def engines(self) -> Engines:
        return engines_for(self.layout, self.schedule, self.dp_kind, self.tables)

    @property
    def pipelined(self) -> bool:
        return self.engines.pipelined

    @property
    def pipeline_schedule(self) -> str | None:
        return self.engines.schedule

    @property
    def stages_per_rank(self) -> int:
        return self.engines.stages_per_rank

    @property
    def data_engine(self) -> str | None:
        return self.engines.data_engine

    def config_fields(self) -> dict:
        """The ``TrainConfig`` fields that train this: layout and engine choices."""
        return {"layout": self.layout, **{n: getattr(self, n) for n in _CHOICES}}

    def replace(self, **changes) -> Parallelism:
        choices = {n: changes.pop(n) for n in _CHOICES if n in changes}
        return dataclasses.replace(self, layout=self.layout.replace(**changes), **choices)

    def __str__(self) -> str:
        return describe(self.layout, self.schedule, self.dp_kind, self.tables)


def parallelism(layout, **choices) -> Parallelism:
    """``layout`` as the planner takes it: a ``Parallelism``, or a ``Layout`` with engine
    choices (none: the defaults)."""
    if isinstance(layout, Parallelism):
        return layout.replace(**choices) if choices else layout
    return Parallelism(layout, **choices)
