"""What a checkpoint holds on each rank, as DCP ``Stateful`` objects.

The model and optimizer go through torch's state-dict helpers (``get_state_dict`` /
``set_state_dict``): their keys are the whole model's parameter names whatever wraps the
model (DDP, FSDP2, tensor parallel), and their values are each rank's shards as DTensors
where the layout splits them, so DCP writes each shard once and can load them into another
layout or rank count (it reshards). The RNG states are per rank (``rng.rank<r>``): they are
restored when the rank count is the same, and left as the seed made them otherwise.
"""

from __future__ import annotations

import torch
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful


class ModelAndOptimizer(Stateful):
    """This rank's model (its unwrapped module) and optimizer."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer):
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict:
        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def load_state_dict(self, state_dict: dict) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optimizer"])


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
