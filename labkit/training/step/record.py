"""``StepRecord``: what one rank measured in one training step, for every layout alike.

A report keeps records as plain dicts (``to_dict``), so that they travel from the ranks and
save as JSON; ``StepRecord.from_dict`` gives the typed record back. The dict has every field
below, flat, plus the measurements of observers (``extras``: a recommender's ``lookup_s``,
``state_bytes``, ``held_out_auc``...) and these summaries of ``comm``:

* ``comm_bytes``, ``comm_wire_bytes``, ``comm_calls``: totals over the step;
* ``comm_kinds``: ``{collective: [calls, tensor bytes, bytes sent per rank]}``, over every
  dimension;
* ``comm_dims``: ``{dimension: {"calls", "bytes", "wire_bytes", "seconds"}}``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from labkit.runtime.comm.meter import CommStat, totals_by_kind

_SUMMARIES = ("comm_bytes", "comm_wire_bytes", "comm_calls", "comm_kinds", "comm_dims")


@dataclass
class StepRecord:
    """One step on one rank.

    Attributes:
        loss: the loss of this rank's slice of the batch (NaN on pipeline stages that do
            not compute it).
        step_s: the step, first op to the end of the optimizer step (device time on GPUs).
        forward_s, backward_s, optimizer_s: time in each phase (a pipeline's: the stage's
            forward and backward chunks, from its timeline).
        comm_s: communication the step waited for (exposed: not hidden behind computation;
            a pipeline's: its idle time, waiting for activations and gradients).
        compute_s: ``step_s - comm_s``.
        comm_busy_s: all time inside communication (overlapped or not).
        comm: per (mesh dimension, collective): calls, tensor bytes, wire bytes, seconds.
        memory_tracked: the memory tracker was on (its per-op bookkeeping slows the step).
        timeline: a pipeline stage's forward ("F") and backward ("B") chunks: {"kind",
            "microbatch", "stage", "start", "end"} (wall-clock seconds); None otherwise.
        extras: observers' measurements of this step.
    """

    loss: float
    step_s: float
    forward_s: float
    backward_s: float
    optimizer_s: float
    comm_s: float
    compute_s: float
    comm_busy_s: float
    comm: list[CommStat] = field(default_factory=list)
    memory_tracked: bool = False
    timeline: list[dict] | None = None
    extras: dict = field(default_factory=dict)

    # ----- communication, summed ----------------------------------------------------------
    @property
    def comm_bytes(self) -> int:
        return sum(s.bytes for s in self.comm)

    @property
    def comm_wire_bytes(self) -> float:
        return sum(s.wire_bytes for s in self.comm)

    @property
    def comm_calls(self) -> int:
        return sum(s.calls for s in self.comm)

    @property
    def comm_kinds(self) -> dict[str, list]:
        """{collective: [calls, tensor bytes, bytes sent per rank]}, over every dimension."""
        return totals_by_kind(self.comm)

    @property
    def comm_dims(self) -> dict[str, dict]:
        """{dimension: {"calls", "bytes", "wire_bytes", "seconds"}}, over every collective."""
        out: dict[str, dict] = {}
        for s in self.comm:
            totals = out.setdefault(s.dim, {"calls": 0, "bytes": 0, "wire_bytes": 0.0,
                                            "seconds": 0.0})
            totals["calls"] += s.calls
            totals["bytes"] += s.bytes
            totals["wire_bytes"] += s.wire_bytes
            totals["seconds"] += s.seconds
        return out

    # ----- as plain data -----------------------------------------------------------------
    def to_dict(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
               if f.name not in ("comm", "extras")}
        out["comm"] = [dataclasses.asdict(s) for s in self.comm]
        out.update({name: getattr(self, name) for name in _SUMMARIES})
        return {**out, **self.extras}

    @classmethod
    def from_dict(cls, data: dict) -> StepRecord:
        names = {f.name for f in dataclasses.fields(cls)} - {"comm", "extras"}
        fields = {k: v for k, v in data.items() if k in names}
        extras = {k: v for k, v in data.items()
                  if k not in names and k not in _SUMMARIES and k != "comm"}
        comm = [CommStat(**s) for s in data.get("comm", [])]
        return cls(**fields, comm=comm, extras=extras)
