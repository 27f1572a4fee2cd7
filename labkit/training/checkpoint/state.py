"""What a checkpoint holds on each rank, as DCP ``Stateful`` objects.

The model and optimizer go through torch's state-dict helpers (``get_model_state_dict`` /
``get_optimizer_state_dict`` and their ``set_`` twins). Every key is the whole model's
parameter name, whatever wraps or splits the model, so that any layout can load what any
other saved and DCP reshards between them:

* DDP, FSDP2, tensor parallel, placed embedding tables: the helpers already give the whole
  model's names; values are this rank's shards as DTensors where the layout splits them
  (DCP writes each shard once), whole tensors where it does not (a table-wise table is
  written by the one rank that holds it; a replicated weight by one of its holders).
* A pipeline: each rank holds stages, ``nn.Sequential`` pieces whose names ("0.weight") are
  not the model's; ``Built.names`` maps them back ("layers.4.weight"), as torchtitan's stages
  keep the model's names, so a pipeline's checkpoint loads on one rank and vice versa.
* The optimizer state is *flattened* (``flatten_optimizer_state_dict``: one key per
  parameter and state, ``state.layers.4.weight.exp_avg``), so ranks holding different
  parameters never write one key with different values (a pipeline's param_groups would).
* ZeRO-1: ``ZeroRedundancyOptimizer`` keeps whole state tensors for the parameters a rank
  owns; its inner optimizer's flattened state names exactly those, so each owner writes its
  own, and on another rank count each rank reads those of the parameters it owns there.
  A rank that owns none (fewer parameter tensors than ranks) has no optimizer state at all.

The RNG states are per rank (``rng.rank<r>``): they are restored when the rank count is the
same, and left as the seed made them otherwise.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.optim import ZeroRedundancyOptimizer

_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)
_OPTIMIZER_PREFIXES = ("state.", "param_groups.")


class ModelAndOptimizer(Stateful):
    """This rank's model parts (unwrapped) and their one optimizer, under the whole model's
    names. ``names``: per part, its tensor names -> the model's ({} where equal)."""

    def __init__(self, parts: list[nn.Module], names: list[dict[str, str]],
                 optimizer: torch.optim.Optimizer):
        # One module over every part ("0.<name in part 0>", ...): the helpers need a module
        # that holds every parameter the optimizer updates.
        self.model = nn.ModuleList(parts)
        self.optimizer = (optimizer.optim if isinstance(optimizer, ZeroRedundancyOptimizer)
                          else optimizer)  # ZeRO-1: the owned parameters' own optimizer
        self.to_model = {}
        for i, (part, part_names) in enumerate(zip(parts, names, strict=True)):
            for name in part.state_dict():
                # a stage's every tensor has a model name; a whole model keeps its own
                self.to_model[f"{i}.{name}"] = part_names[name] if part_names else name
        self.to_parts = {v: k for k, v in self.to_model.items()}
        # ZeRO-1 on more ranks than parameter tensors: some own none (torch's helpers refuse
        # an optimizer without state), they save and load no optimizer state
        self.owns = any(group["params"] for group in self.optimizer.param_groups)

    def state_dict(self) -> dict:
        model = get_model_state_dict(self.model, options=_OPTIONS)
        optimizer = (get_optimizer_state_dict(self.model, self.optimizer, options=_OPTIONS)
                     if self.owns else {})
        return {"model": _rename(model, self.to_model),
                "optimizer": _rename_optimizer(optimizer, self.to_model)}

    def load_state_dict(self, state_dict: dict) -> None:
        set_model_state_dict(self.model, _rename(state_dict["model"], self.to_parts),
                             options=_OPTIONS)
        if self.owns:
            set_optimizer_state_dict(self.model, self.optimizer,
                                     _rename_optimizer(state_dict["optimizer"], self.to_parts),
                                     options=_OPTIONS)


def _rename(state: dict, names: dict[str, str]) -> dict:
    return {names[key]: value for key, value in state.items()}


def _rename_optimizer(state: dict, names: dict[str, str]) -> dict:
    """Flattened optimizer keys ("state.<parameter>.exp_avg", "param_groups.<parameter>.lr")
    with the parameter renamed (optimizer fields hold no dots)."""
    out = {}
    for key, value in state.items():
        prefix = next(p for p in _OPTIMIZER_PREFIXES if key.startswith(p))
        parameter, field = key[len(prefix):].rsplit(".", 1)
        out[f"{prefix}{names[parameter]}.{field}"] = value
    return out


class RandomState(Stateful):
    """This rank's generators: torch's CPU one, and the current CUDA device's on a GPU."""

    def __init__(self, device: torch.device):
        self.device = device

    def state_dict(self) -> dict:
        out = {"cpu": torch.get_rng_state()}
        if self.device.type == "cuda":
            out["cuda"] = torch.cuda.get_rng_state(self.device)
        return out

    def load_state_dict(self, state_dict: dict) -> None:
        torch.set_rng_state(state_dict["cpu"])
        if "cuda" in state_dict:
            torch.cuda.set_rng_state(state_dict["cuda"], self.device)


def rng_key(rank: int) -> str:
    return f"rng.rank{rank}"
