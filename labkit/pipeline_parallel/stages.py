"""Cut a zoo model into consecutive stages, one per rank, for pipeline parallelism."""

from __future__ import annotations

import torch
from torch import nn

from labkit.models import GPT, MLP


class _GPTEmbedding(nn.Module):
    """The first piece of a GPT: token plus position embeddings."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)  # (batch, seq, d_model)


def as_layers(model: nn.Module) -> list[nn.Module]:
    """The model as a list of modules applied one after another."""
    if isinstance(model, MLP):
        return list(model.layers)
    if isinstance(model, GPT):
        return [_GPTEmbedding(model), *model.blocks, model.norm, model.head]
    raise ValueError(f"{type(model).__name__} cannot be cut into a pipeline here: choose the "
                     "zoo's 'mlp' or 'gpt' (DLRM's tables are split by sharding, notebook 06)")


def _weight(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def split_stages(model: nn.Module, num_stages: int) -> list[nn.Sequential]:
    """Consecutive groups with equal numbers of layers that hold weights, one per stage
    (an activation stays with the layer before it)."""
    layers = as_layers(model)
    weighted = [i for i, layer in enumerate(layers) if _weight(layer) > 0]
    if num_stages < 1 or len(weighted) < num_stages:
        raise ValueError(f"the model has {len(weighted)} layers with weights: it cannot fill "
                         f"{num_stages} stages; use fewer stages or more layers")
    cuts = [0] + [weighted[k * len(weighted) // num_stages] for k in range(1, num_stages)]
    cuts.append(len(layers))
    return [nn.Sequential(*layers[a:b]) for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
