"""The engine choices beside a layout's degrees: what runs each dimension.

    labkit.train(cluster, model="gpt", layout=labkit.Layout(pp=2), schedule="gpipe")
    labkit.train(cluster, model="gpt", layout=labkit.Layout(dp=2), dp_kind="naive")
    labkit.train(cluster, model="gpt", layout=labkit.Layout(tp=2), tp_kind="naive")

A ``Layout`` says how many ways each dimension splits (``labkit/training/layout``); these
say how the split runs. Each is a ``TrainConfig`` field, None for the default:

* ``schedule``: the pipeline schedule: torch.distributed.pipelining's "gpipe", "1f1b",
  "interleaved_1f1b" (two stages per rank), or labkit's hand-written ones over send/recv,
  for reading (``labkit/parallel/pipeline/naive.py``): "naive_gpipe", "naive_1f1b", and
  "naive" (one batch at a time, no micro-batches). Default: "1f1b" when pp > 1, no pipeline
  otherwise. Given with pp=1, a one-stage pipeline runs.
* ``dp_kind``: how the data-parallel dimensions run: "ddp" (PyTorch's DDP; its FSDP2-based
  ``replicate`` when the replica is itself split by tp or pp), "naive" (hand-written
  AllReduce, for reading), "zero1" (DDP with the optimizer state sharded over dp), "fsdp"
  (FSDP2; HSDP, replicated over dp and sharded over fsdp, when both are > 1). Default:
  "fsdp" when fsdp > 1, else "ddp" when dp > 1, else none. Given with degree 1, the engine
  still runs.
* ``tables``: the DLRM's embedding tables placed over the fsdp dimension: "table_wise"
  (whole tables, by a planner), "row_wise" (rows split), "row_wise_dtensor" (DTensor's
  RowwiseParallel). The dense part is data parallel over dp x fsdp and the tables are
  replicated over dp. Default: the tables are sharded like the rest.
* ``tp_kind``: what splits the layers' matrices over tp: "dtensor" (PyTorch's DTensor,
  ``parallelize_module`` with the model's plan) or "naive" (labkit's hand-written Megatron
  layers, ``labkit/parallel/tensor/layers.py``, for reading: f and g as autograd functions
  over the tp group). Default: "dtensor" when tp > 1, none otherwise. "naive" runs with tp
  and hand-written data parallelism only (see ``labkit/training/rules.py``).
* ``cp_engine`` (``labkit/parallel/context/engine.py``): what runs context parallelism.

``Engines`` is the answer with every default filled in, made once when a run is resolved
(``labkit/training/run.py``) and read by everything after.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

SCHEDULES = ("naive", "naive_gpipe", "naive_1f1b", "gpipe", "1f1b", "interleaved_1f1b")
# each hand-written schedule, and torch's that runs forwards and backwards in its order
SAME_ORDER = {"naive": "gpipe", "naive_gpipe": "gpipe", "naive_1f1b": "1f1b"}
DP_KINDS = ("ddp", "naive", "zero1", "fsdp")
TABLES = ("table_wise", "row_wise", "row_wise_dtensor")
TP_KINDS = ("dtensor", "naive")
DEFAULT_SCHEDULE = "1f1b"  # torchtitan's and Megatron-LM's default
CHOICES = {"schedule": SCHEDULES, "dp_kind": DP_KINDS, "tables": TABLES, "tp_kind": TP_KINDS}
CHOICE_FIELDS = tuple(CHOICES)  # the TrainConfig fields that choose an engine


@dataclass(frozen=True)
class Engines:
    """What runs each dimension of a layout, every default filled in.

    Attributes:
        schedule: the pipeline schedule that runs, or None without a pipeline.
        dp_kind: the data-parallel engine ("ddp", "naive", "zero1", "fsdp"), or None (one
            replica, no engine; or the DLRM's tables, which average by hand).
        tables: the DLRM's table placement over fsdp, or None.
        cp_engine: what runs context parallelism ("ring", "torch"), or None when cp = 1.
        tp_kind: what splits the matrices over tp ("dtensor", "naive"), or None when tp = 1.
    """

    schedule: str | None = None
    dp_kind: str | None = None
    tables: str | None = None
    cp_engine: str | None = None
    tp_kind: str | None = None

    @property
    def pipelined(self) -> bool:
        return self.schedule is not None

    @property
    def schedule_order(self) -> str | None:
        """The order the schedule runs forwards and backwards in, as the torch schedule that
        runs it: "gpipe", "1f1b", "interleaved_1f1b", or None without a pipeline."""
        return SAME_ORDER.get(self.schedule, self.schedule)

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


def engines_for(layout, schedule: str | None = None, dp_kind: str | None = None,
                tables: str | None = None, cp_engine: str | None = None,
                tp_kind: str | None = None) -> Engines:
    """The engines that run ``layout`` with these choices (None: the default);
    ``cp_engine`` already decided for the device ("ring", "torch"), or None."""
    pipelined = layout.pp > 1 or schedule is not None
    if dp_kind is None and tables is None:
        dp_kind = "fsdp" if layout.fsdp > 1 else ("ddp" if layout.dp > 1 else None)
    return Engines((schedule or DEFAULT_SCHEDULE) if pipelined else None, dp_kind, tables,
                   cp_engine if layout.cp > 1 else None,
                   (tp_kind or "dtensor") if layout.tp > 1 else None)


def describe(layout, schedule: str | None = None, dp_kind: str | None = None,
             tables: str | None = None, tp_kind: str | None = None) -> str:
    """A layout with its engine choices, for titles: ``"pp2 x dp2 (1f1b)"``,
    ``"fsdp4 (fsdp)"``, ``"tp2 (naive tp)"`` (the data-parallel and tensor-parallel engines
    named only where they were chosen)."""
    pipeline = (schedule or DEFAULT_SCHEDULE) if layout.pp > 1 or schedule else None
    extras = [v for v in (pipeline, dp_kind, tables) if v]
    extras += [f"{tp_kind} tp"] if tp_kind else []
    extras += [f"experts over dp{layout.ep}"] if layout.ep > 1 else []
    text = layout.degrees_text()
    return f"{text} ({', '.join(extras)})" if extras else text


def check_choice(owner: str, name: str, value) -> None:
    """One engine choice: one of its names, or None."""
    choices = CHOICES[name]
    if value is not None and value not in choices:
        raise ValueError(f"{owner}({name}={value!r}): choose one of {', '.join(choices)} "
                         "(or leave it out)")
