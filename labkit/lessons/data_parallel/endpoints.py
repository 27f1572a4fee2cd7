"""Where training ends: the same data and steps from different starting weights, one start per
rank (N independent runs at once). Each ends at its own loss: gradient descent, on one device
or many, finds a low point near where it started, not the lowest point there is.
"""

from __future__ import annotations

from dataclasses import dataclass

from labkit.lessons.data_parallel.held_out import held_out_loss
from labkit.lessons.show.table import html_table
from labkit.models import build_model, loss_fn, make_batch
from labkit.models.optim import make_optimizer

INIT_SEED = 100  # rank r starts from the weights of seed 100 + r


def _endpoint_job(ctx, config) -> dict:
    model = build_model(config.model, ctx.device, INIT_SEED + ctx.rank)
    optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr)
    for step in range(config.steps):
        inputs, targets = make_batch(config.model, step, config.global_batch, config.seed)
        loss = loss_fn(config.model)(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    return {"loss": loss.item(), "weights": weights}


@dataclass
class Endpoints:
    train_losses: list[float]  # one per starting point
    held_out_losses: list[float]

    @property
    def spread(self) -> float:
        return max(self.held_out_losses) - min(self.held_out_losses)

    def to_dict(self) -> dict:
        return {"train_losses": self.train_losses, "held_out_losses": self.held_out_losses,
                "spread": self.spread}

    def _repr_html_(self) -> str:
        rows = [[f"seed {INIT_SEED + r}", f"{t:.6f}", f"{h:.6f}"] for r, (t, h) in
                enumerate(zip(self.train_losses, self.held_out_losses, strict=True))]
        return html_table("same data, same steps, different starting weights",
                          ["start", "last training loss", "held-out loss"], rows,
                          "measured here, one start per rank")


def endpoints(cluster, config) -> Endpoints:
    ranks = cluster.run(_endpoint_job, config)
    held = [held_out_loss(config, r["weights"]) for r in ranks]
    return Endpoints([r["loss"] for r in ranks], held)
