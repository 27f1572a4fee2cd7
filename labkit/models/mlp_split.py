"""How the zoo's MLP is split: linear pairs by tensors (column-wise then row-wise, Megatron's
MLP), layers into pipeline stages, each linear an FSDP unit."""

from __future__ import annotations

from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.models.split import ParallelPlan


def linear_pairs_plan(sequential: nn.Sequential) -> dict:
    """Pairs of linear layers in a Sequential: column-wise, then row-wise (no collective
    between the two). With an odd count the last layer stays whole on every rank."""
    linears = [name for name, m in sequential.named_children() if isinstance(m, nn.Linear)]
    plan = {}
    for column, row in zip(linears[::2], linears[1::2], strict=False):  # odd: last left out
        plan[column], plan[row] = ColwiseParallel(), RowwiseParallel()
    return plan


class MLPPlan(ParallelPlan):
    family = "mlp"
    splits_tensors = True

    def check_tp(self, config, degree: int) -> None:
        if config.d_hidden % degree:
            raise ValueError(f"the MLP's width d_hidden={config.d_hidden} does not split over "
                             f"{degree} ranks: choose a degree that divides it")

    def check_pipeline(self, config, stages: int) -> None:
        if config.n_layers < stages:
            raise ValueError(f"the model has {config.n_layers} layers with weights: it cannot "
                             f"fill {stages} stages; use fewer stages or more layers "
                             f"(n_layers >= {stages})")

    def tp_styles(self, model: nn.Module) -> dict:
        return {f"layers.{name}": style
                for name, style in linear_pairs_plan(model.layers).items()}

    def layers(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [(f"layers.{name}", m) for name, m in model.layers.named_children()]

    def fsdp_units(self, module: nn.Module) -> list[nn.Module]:
        return [m for m in module.modules() if isinstance(m, nn.Linear) and m is not module]
