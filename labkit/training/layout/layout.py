"""``labkit.Layout``: how many ways a run splits along each dimension of parallelism.

    labkit.Layout(dp=2, tp=2)               # 2 replicas, each split over 2 ranks by tensors
    labkit.Layout(fsdp=2, tp=2)             # 2D: FSDP shards over 2, TP splits over 2
    labkit.Layout(dp=2, pp=2)               # 2 replicas of a 2-stage pipeline

The degrees only (as torchtitan's ``ParallelDims``): what runs each dimension (the pipeline
schedule, the data-parallel engine, the DLRM's tables) is chosen beside it
(``labkit/training/engines.py``: ``TrainConfig(layout=..., schedule="gpipe")``).

The four dimensions (Megatron-LM and torchtitan use the same ones):

* ``pp``: pipeline stages; each stage holds consecutive layers.
* ``dp``: replicas; each holds the whole (stage of the) model and trains on its own slice of
  the batch, gradients averaged.
* ``fsdp``: sharded data parallelism; ranks train on their own slices of the batch but keep
  only a shard of the model state (FSDP2; for the DLRM, the ``tables`` engine choice may
  place embedding tables over this dimension instead).
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
import functools
import math
import numbers
from dataclasses import dataclass

MESH_ORDER = ("pp", "dp", "fsdp", "cp", "tp")  # torchtitan's order: cp just outside tp
# TrainConfig's, not a Layout's
ENGINE_FIELDS = ("schedule", "dp_kind", "tables", "tp_kind", "cp_engine")


@dataclass(frozen=True)
class Layout:
    """The degree of each dimension of parallelism.

    Attributes:
        dp, fsdp, tp, pp: the degrees (at least 1 each; their product is the world size).
        cp: context parallelism's degree: each sequence cut into 2 x cp chunks, rank i of a
            cp group holding chunks i and 2cp-1-i; attention by ring attention, gradients
            averaged over cp.
        ep: expert parallelism: a mixture of experts' experts cut over the dp ranks (ep
            equals dp: not a dimension of its own, the dp ranks borrowed, as DeepSpeed-MoE
            and torchtitan do); tokens reach their experts by all-to-all over dp.
    """

    dp: int = 1
    fsdp: int = 1
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1

    def __post_init__(self):
        for dim in (*MESH_ORDER, "ep"):
            value = getattr(self, dim)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
                raise ValueError(f"Layout({dim}={value!r}): a degree is a whole number of ranks, "
                                 "at least 1")
            object.__setattr__(self, dim, int(value))  # numpy's integers become plain ints

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

    def degrees_text(self) -> str:
        """``"pp2 x dp2 x tp2"``: the degrees above 1, in mesh order."""
        parts = [f"{dim}{getattr(self, dim)}" for dim in MESH_ORDER if getattr(self, dim) > 1]
        return " x ".join(parts) or "1 device"

    def __str__(self) -> str:
        text = self.degrees_text()
        return f"{text} (experts over dp{self.ep})" if self.ep > 1 else text


def _refuse_engine_choices(kwargs: dict) -> None:
    """An engine choice given to ``Layout`` (where it lived once): say where it goes."""
    moved = {n: kwargs[n] for n in ENGINE_FIELDS if n in kwargs}
    if moved:
        degrees = ", ".join(f"{n}={v!r}" for n, v in kwargs.items() if n not in moved)
        choices = ", ".join(f"{n}={v!r}" for n, v in moved.items())
        planner = ("" if {"cp_engine", "tp_kind"} & set(moved) else
                   f"; the planner's: labkit.plan.Parallelism(layout, {choices})")
        raise TypeError(f"Layout holds the degrees only; {choices} is chosen beside it: "
                        f"labkit.train(cluster, layout=labkit.Layout({degrees}), "
                        f"{choices}) (a TrainConfig field{planner})")


_dataclass_init = Layout.__init__


@functools.wraps(_dataclass_init)  # the signature shown is the degrees'
def _init(self, *args, **kwargs):
    _refuse_engine_choices(kwargs)
    _dataclass_init(self, *args, **kwargs)


Layout.__init__ = _init
