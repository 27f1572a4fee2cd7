"""How the mixture-of-experts GPT is split: its experts over the data-parallel ranks
(expert parallelism, ``labkit/parallel/expert``), the rest replicated. It is not built with
tensor, pipeline, context or fully sharded parallelism here: those are refused."""

from __future__ import annotations

from torch import nn

from labkit.models.gpt_split import GPTPlan


class MoEPlan(GPTPlan):
    family = "moe_gpt"
    splits_tensors = False

    def check_tp(self, config, degree: int) -> None:
        if degree > 1:
            raise ValueError("the MoE GPT is split by experts here (Layout(dp=N, ep=N)), not by "
                             "tensors: use tp=1")

    def check_pipeline(self, config, stages: int) -> None:
        raise ValueError("the MoE GPT is not cut into pipeline stages here: use pp=1")

    def check_cp(self, config, degree: int) -> None:
        if degree > 1:
            raise ValueError("context parallelism runs on the dense 'gpt' here, not the MoE "
                             "GPT: use cp=1")

    def check_checkpointing(self, config) -> None:
        raise ValueError("activation checkpointing is not built for the MoE GPT here: use "
                         "activation_checkpointing=False")

    def check_ep(self, config, degree: int) -> None:
        if config.n_experts % degree:
            raise ValueError(f"{config.n_experts} experts do not split over ep={degree} ranks: "
                             f"choose n_experts a multiple of {degree}")

    def fsdp_units(self, module: nn.Module) -> list[nn.Module]:
        return []

    def tp_styles(self, model: nn.Module) -> dict:
        return {}
