"""Cut a model's chain of layers (its plan's ``layers``) into consecutive pipeline stages."""

from __future__ import annotations

from itertools import chain

from torch import nn

Pieces = list[tuple[str, nn.Module]]  # (name prefix in the whole model, module)


def _holds_weights(module: nn.Module) -> bool:
    return any(True for _ in module.parameters())


def split_stages(layers: Pieces, num_stages: int) -> list[Pieces]:
    """Consecutive groups with equal numbers of layers that hold weights, one per stage (an
    activation stays with the layer before it)."""
    weighted = [i for i, (_, layer) in enumerate(layers) if _holds_weights(layer)]
    if num_stages < 1 or len(weighted) < num_stages:
        raise ValueError(f"the model has {len(weighted)} layers with weights: it cannot fill "
                         f"{num_stages} stages; use fewer stages or more layers")
    cuts = [0] + [weighted[k * len(weighted) // num_stages] for k in range(1, num_stages)]
    cuts.append(len(layers))
    return [layers[a:b] for a, b in zip(cuts[:-1], cuts[1:], strict=True)]


def stage_module(pieces: Pieces) -> tuple[nn.Sequential, dict[str, str]]:
    """The stage as one module, and the whole model's name of each of its parameters and
    buffers (``{"0.weight": "layers.4.weight", ...}``)."""
    module = nn.Sequential(*(layer for _, layer in pieces))
    names = {}
    for i, (prefix, layer) in enumerate(pieces):
        for name, _ in chain(layer.named_parameters(), layer.named_buffers()):
            names[f"{i}.{name}"] = f"{prefix}.{name}" if prefix else name
    return module, names


def stage_ids(pp_rank: int, pp: int, per_rank: int) -> list[int]:
    """The stages a pipeline rank holds: rank r holds r, r + pp, ... (interleaved: v per
    rank, Narayanan et al. 2021, so that consecutive stages are on neighbouring ranks)."""
    return [pp_rank + v * pp for v in range(per_rank)]
