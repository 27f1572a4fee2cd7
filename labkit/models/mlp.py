"""A multilayer perceptron, and regression data from a hidden teacher network."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import labkit.models.fields as fields


@dataclass(frozen=True)
class MLPConfig:
    """A stack of Linear + ReLU layers. Parameters ~ n_layers * d_hidden**2."""

    d_in: int = 64
    d_hidden: int = 256
    n_layers: int = 4
    d_out: int = 8

    @property
    def name(self) -> str:
        return "mlp"

    def __post_init__(self):
        fields.whole(self, "d_in", "d_hidden", "n_layers", "d_out")


class MLP(nn.Module):
    def __init__(self, config: MLPConfig):
        super().__init__()
        widths = [config.d_in] + [config.d_hidden] * (config.n_layers - 1) + [config.d_out]
        layers: list[nn.Module] = []
        for i, (d_a, d_b) in enumerate(zip(widths[:-1], widths[1:], strict=True)):
            layers.append(nn.Linear(d_a, d_b))
            if i < len(widths) - 2:
                layers.append(nn.ReLU())
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)  # (batch, d_in) -> (batch, d_out)

    @staticmethod
    def loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(output, target)


def mlp_batch(config: MLPConfig, step: int, batch_size: int, seed: int = 0):
    """Inputs ~ N(0, 1); targets from a fixed random 1-hidden-layer teacher (seeded by ``seed``)."""
    teacher = torch.Generator().manual_seed(10_000 + seed)
    w1 = torch.randn(config.d_in, 32, generator=teacher) / config.d_in**0.5
    w2 = torch.randn(32, config.d_out, generator=teacher) / 32**0.5
    data = torch.Generator().manual_seed(seed * 1_000_003 + step)
    x = torch.randn(batch_size, config.d_in, generator=data)
    return x, torch.tanh(x @ w1) @ w2  # (batch, d_in), (batch, d_out)
