"""Held-out loss: does training on N devices generalise differently from one device?

Each run returns its final weights (``return_weights=True``); the loss is then computed on the
host on samples no step trained on (batches drawn far beyond the training steps).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.lessons.show.table import html_table
from labkit.models import build_model, loss_fn, make_batch

HELD_OUT_STEP = 1_000_000  # the data of "step" 1e6: never reached by training


def held_out_loss(config, weights: dict, samples: int = 1024) -> float:
    """The loss of ``weights`` (a zoo model's state dict) on held-out samples of its data."""
    model = build_model(config.model)
    model.load_state_dict(weights)
    inputs, targets = make_batch(config.model, HELD_OUT_STEP, samples, config.seed)
    with torch.no_grad():
        return loss_fn(config.model)(model(inputs), targets).item()


@dataclass
class HeldOut:
    losses: dict  # run name -> held-out loss
    train_losses: dict  # run name -> last training loss

    @property
    def gap(self) -> float:
        values = list(self.losses.values())
        return max(values) - min(values)

    def to_dict(self) -> dict:
        return {"losses": self.losses, "train_losses": self.train_losses, "gap": self.gap}

    def _repr_html_(self) -> str:
        rows = [[name, f"{self.train_losses[name]:.6f}", f"{loss:.6f}"]
                for name, loss in self.losses.items()]
        return html_table("loss after training", ["run", "last training loss",
                                                  "held-out loss"], rows,
                          f"measured here; largest difference {self.gap:.1e}")


def held_out(runs: dict) -> HeldOut:
    """Held-out loss of each run in ``runs`` (name -> TrainReport with weights)."""
    losses, last = {}, {}
    for name, report in runs.items():
        weights = report.ranks[0].get("weights")
        if weights is None:
            raise ValueError(f"run {name!r} has no weights: train it with return_weights=True")
        losses[name] = held_out_loss(report.config, weights)
        last[name] = report.losses[-1]
    return HeldOut(losses, last)
