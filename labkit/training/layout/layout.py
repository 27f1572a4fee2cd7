"""``labkit.Layout``: how many ways a run splits along each dimension of parallelism.

    labkit.Layout(dp=2, tp=2)               # 2 replicas, each split over 2 ranks by tensors
    labkit.Layout(fsdp=2, tp=2)             # 2D: FSDP shards over 2, TP splits over 2
    labkit.Layout(dp=2, pp=2, schedule="gpipe")

The four dimensions (Megatron-LM and torchtitan use the same ones):

* ``pp``: pipeline stages; each stage holds consecutive layers.
* ``dp``: replicas; each holds the whole (stage of the) model and trains on its own slice of
  the batch, gradients averaged.
* ``fsdp``: sharded data parallelism; ranks train on their own slices of the batch but keep
  only a shard of the model state (FSDP2; for the DLRM, ``tables`` may place embedding tables
  over this dimension instead).
* ``cp``: context parallelism; ranks hold slices of each sequence (the same samples, other
  tokens) and pass attention's keys and values round a ring (``labkit/parallel/context``).
* ``tp``: tensor parallelism; ranks split each layer's matrices and see the same samples.

The product of the degrees is the number of ranks. Ranks are numbered along
:data:`MESH_ORDER`, ``pp`` outermost and ``tp`` innermost: ``tp`` groups are consecutive
ranks, which on a real machine share a node and its fastest links (NVLink). Tensor
parallelism moves activations in every layer, forward and backward, so it needs those links
most; data parallelism moves gradients once a step and can cross nodes; a pipeline sends one
activation per micro-batch between neighbours and tolerates the slowest links.

A layout is plain data (no process, no torch.distributed): it can be checked, printed and
drawn before any rank starts. ``labkit.training.layout.mesh`` turns it into the run's DeviceMesh.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass

MESH_ORDER = ("pp", "dp", "fsdp", "cp", "tp")  # torchtitan's order: cp just outside tp
SCHEDULES = ("naive", "gpipe", "1f1b", "interleaved_1f1b")
DP_KINDS = ("ddp", "naive", "zero1", "fsdp")
TABLES = ("table_wise", "row_wise", "row_wise_dtensor")
DEFAULT_SCHEDULE = "1f1b"  # torchtitan's and Megatron-LM's default


@dataclass(frozen=True)
class Layout:
    """Degrees of each dimension, and how the data-parallel and pipeline ones are run.

    Attributes:
        dp, fsdp, tp, pp: the degrees (at least 1 each; their product is the world size).
        schedule: the pipeline schedule: "naive" (hand-written, one batch at a time),
            "gpipe", "1f1b", "interleaved_1f1b" (two stages per rank). None: "1f1b" when
            pp > 1, no pipeline otherwise. Given with pp=1, a one-stage pipeline runs.
        dp_kind: how the data-parallel dimensions are run: "ddp" (PyTorch's DDP; its
            FSDP2-based ``replicate`` when the replica is itself split by tp or pp), "naive"
            (hand-written AllReduce, for reading), "zero1" (DDP with the optimizer state
            sharded over dp), "fsdp" (FSDP2; HSDP, replicated over dp and sharded over
            fsdp, when both are > 1). None: "fsdp" when fsdp > 1, else "ddp" when dp > 1,
            else none (one device's training). Given with degree 1, the engine still runs.
        tables: the DLRM's embedding tables placed over the fsdp dimension: "table_wise"
            (whole tables, by a planner), "row_wise" (rows split), "row_wise_dtensor"
            (DTensor's RowwiseParallel). The dense part is data parallel over dp x fsdp and
            the tables are replicated over dp. None: the tables are sharded like the rest.
        cp: context parallelism's degree: each sequence cut into 2 x cp chunks, rank i of a
            cp group holding chunks i and 2cp-1-i; attention by ring attention, gradients
            averaged over cp (last field, so the positional order of the others is kept).
        ep: expert parallelism: a mixture of experts' experts cut over the dp ranks (ep
            equals dp: not a dimension of its own, the dp ranks borrowed, as DeepSpeed-MoE
            and torchtitan do); tokens reach their experts by all-to-all over dp.
    """

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str | None = None
    dp_kind: str | None = None
    tables: str | None = None
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for dim in (*MESH_ORDER, "ep"):
            value = getattr(self, dim)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"Layout({dim}={value!r}): a degree is a whole number of ranks, "
                                 "at least 1")
            object.__setattr__(self, dim, int(value))  # numpy's integers become plain ints
        _check_choice("schedule", self.schedule, SCHEDULES)
        _check_choice("dp_kind", self.dp_kind, DP_KINDS)
        _check_choice("tables", self.tables, TABLES)

    # ----- what the layout means ---------------------------------------------------------
    @property
    def size(self) -> int:
        """Ranks the layout needs: the product of the degrees."""
        return math.prod(self.degrees.values())

    @property
    def degrees(self) -> dict[str, int]:
        """{dimension: degree} in mesh order (pp outermost, tp innermost)."""
        return {dim: getattr(self, dim) for dim in MESH_ORDER}

    @property
    def data_size(self) -> int:
        """How many slices the batch is cut into: one per (dp, fsdp) coordinate."""
        return self.dp * self.fsdp

    @property
    def pipelined(self) -> bool:
        return self.pp > 1 or self.schedule is not None

    @property
    def pipeline_schedule(self) -> str | None:
        """The schedule that runs, or None without a pipeline."""
        return (self.schedule or DEFAULT_SCHEDULE) if self.pipelined else None

    @property
    def stages_per_rank(self) -> int:
        return 2 if self.pipeline_schedule == "interleaved_1f1b" else 1

    @property
    def data_engine(self) -> str | None:
        """The data-parallel engine that runs: "ddp", "naive", "zero1", "fsdp", "tables"
        (the DLRM's tables over fsdp, its dense part averaged by hand) or None."""
        if self.tables is not None:
            return "tables"
        if self.dp_kind is not None:
            return self.dp_kind
        if self.fsdp > 1:
            return "fsdp"
        return "ddp" if self.dp > 1 else None

    def replace(self, **changes) -> Layout:
        return dataclasses.replace(self, **changes)

    # ----- ranks and groups (pure arithmetic: for checks and drawings) --------------------
    def coordinates(self, rank: int) -> dict[str, int]:
        """Rank ``rank``'s position along every dimension (row-major in mesh order)."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} is not in a layout of {self.size} ranks")
        out = {}
        for dim in reversed(MESH_ORDER):
            rank, out[dim] = divmod(rank, getattr(self, dim))
        return {dim: out[dim] for dim in MESH_ORDER}

    def rank_at(self, **coordinates: int) -> int:
        """The rank at the given coordinates (missing ones are 0)."""
        rank = 0
        for dim in MESH_ORDER:
            rank = rank * getattr(self, dim) + coordinates.get(dim, 0)
        return rank

    def groups(self, dim: str) -> list[list[int]]:
        """The groups of ranks that communicate along ``dim`` (each group: the ranks that
        differ only in their ``dim`` coordinate), every rank in exactly one."""
        if dim not in MESH_ORDER:
            raise ValueError(f"unknown dimension {dim!r}: one of {MESH_ORDER}")
        seen, out = set(), []
        for rank in range(self.size):
            if rank in seen:
                continue
            where = self.coordinates(rank)
            group = [self.rank_at(**{**where, dim: i}) for i in range(getattr(self, dim))]
            seen.update(group)
            out.append(group)
        return out

    def __str__(self) -> str:
        parts = [f"{dim}{getattr(self, dim)}" for dim in MESH_ORDER if getattr(self, dim) > 1]
        text = " x ".join(parts) or "1 device"
        extras = [v for v in (self.pipeline_schedule, self.dp_kind, self.tables) if v]
        extras += [f"experts over dp{self.ep}"] if self.ep > 1 else []
        return f"{text} ({', '.join(extras)})" if extras else text


def _check_choice(name: str, value, choices: tuple[str, ...]) -> None:
    if value is not None and value not in choices:
        raise ValueError(f"Layout({name}={value!r}): choose one of {', '.join(choices)} "
                         "(or leave it out)")
