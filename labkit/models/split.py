"""What each parallelism needs to know about a model, kept beside the model.

A :class:`ParallelPlan` answers, for one zoo family: can it be split by tensors (and how:
its DTensor plan), by pipeline stages (its chain of layers), what FSDP shards as one unit,
and which degrees suit a given config (with advice when one does not). A new model adds one
plan file here; the parallelisms (``labkit/training/build``) only ask the plan.
"""

from __future__ import annotations

import torch
from torch import nn


class ParallelPlan:
    """The defaults: a model that no parallelism may split (data parallelism still works)."""

    family = "model"
    splits_tensors = False  # has a tensor-parallel plan

    # ----- checks (before any process starts; raise ValueError saying what to change) ----
    def check_tp(self, config, degree: int) -> None:
        if degree > 1:
            raise ValueError(f"tensor parallelism here splits the zoo's 'mlp' and 'gpt', not "
                             f"{self.family!r}")

    def check_pipeline(self, config, stages: int) -> None:
        """Raise unless the model's chain of layers fills ``stages`` stages."""
        raise ValueError(f"a pipeline cuts a chain of layers: choose the zoo's 'mlp' or 'gpt',"
                         f" not {self.family!r}")

    def check_checkpointing(self, config) -> None:
        """Raise unless the model has blocks for activation checkpointing to recompute."""
        raise ValueError(f"activation checkpointing recomputes the transformer blocks of the "
                         f"zoo's 'gpt'; {self.family!r} has no blocks here: choose model='gpt'"
                         f" or activation_checkpointing=False")

    def check_cp(self, config, degree: int) -> None:
        """Raise unless the model has attention over sequences that cut into 2 x degree."""
        if degree > 1:
            raise ValueError(f"context parallelism splits the sequences that attention reads; "
                             f"{self.family!r} has no attention: choose model='gpt' or cp=1")

    def check_ep(self, config, degree: int) -> None:
        raise ValueError(f"expert parallelism spreads a mixture of experts; {self.family!r} "
                         "has none: choose model=labkit.models.MoEGPTConfig()")

    def check_tables(self, config, tables: str, group_size: int) -> None:
        raise ValueError(f"'{tables}' shards the embedding tables of the zoo's 'dlrm', not "
                         f"{self.family!r}")

    # ----- what each parallelism applies --------------------------------------------------
    def tp_styles(self, model: nn.Module) -> dict:
        """{module name: DTensor ParallelStyle} for ``parallelize_module``."""
        return {}

    def layers(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The model as a chain of (name prefix in the model, module), applied in turn."""
        raise NotImplementedError

    def fsdp_units(self, module: nn.Module) -> list[nn.Module]:
        """Submodules of ``module`` that FSDP gathers and frees as one unit each."""
        return []

    def cp_parts(self, model: nn.Module) -> tuple[list[nn.Module], nn.Module]:
        """What context parallelism changes in the whole model: the modules whose
        ``attention`` it replaces, and the position embedding it makes look up the whole
        sequence's positions (``labkit.parallel.context.apply`` does both)."""
        raise NotImplementedError

    def checkpoint_units(self, module: nn.Module) -> list[nn.Module]:
        """Submodules of ``module`` whose activations are recomputed in backward (one
        ``torch.utils.checkpoint`` region each: only their input is kept)."""
        return []

    # ----- weights in tensor-parallel order -----------------------------------------------
    def to_tp_layout(self, name: str, tensor: torch.Tensor, tp: int) -> torch.Tensor:
        """The full weight ``name`` reordered so that DTensor's even split gives each tp rank
        its part (identity unless a fused weight needs it)."""
        return tensor

    def from_tp_layout(self, name: str, tensor: torch.Tensor, tp: int) -> torch.Tensor:
        """The inverse of :meth:`to_tp_layout`."""
        return tensor

