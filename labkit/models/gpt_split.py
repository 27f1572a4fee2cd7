"""How the zoo's GPT is split: each block's attention by heads and its MLP by columns then
rows (Megatron-LM, section 3), the chain embeddings -> blocks -> norm -> head into pipeline
stages, each block an FSDP unit."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.models.gpt import GPT, Block
from labkit.models.split import ParallelPlan


class GPTEmbedding(nn.Module):
    """The first piece of a GPT's chain: token plus position embeddings."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        return self.tok(tokens) + self.pos(positions)  # (batch, seq, d_model)


def _heads_order(rows: int, tp: int) -> torch.Tensor:
    """Row order that turns qkv's [q; k; v] into [q_0 k_0 v_0; q_1 k_1 v_1; ...], so that an
    even split by rows gives tp rank r the q, k and v of its own heads."""
    return torch.arange(rows).view(3, tp, -1).transpose(0, 1).reshape(-1)


class GPTPlan(ParallelPlan):
    family = "gpt"
    splits_tensors = True

    def check_tp(self, config, degree: int) -> None:
        if config.n_heads % degree:
            raise ValueError(f"{config.n_heads} attention heads do not split over {degree} "
                             "ranks: choose a degree that divides n_heads")

    def check_pipeline(self, config, stages: int) -> None:
        weighted = config.n_layers + 3  # embeddings, the blocks, the final norm, the head
        if weighted < stages:
            raise ValueError(f"the model has {weighted} layers with weights: it cannot fill "
                             f"{stages} stages; use fewer stages or more layers (n_layers >= "
                             f"{stages - 3})")

    def tp_styles(self, model: nn.Module) -> dict:
        plan = {}
        for i in range(len(model.blocks)):
            plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(),
                         f"blocks.{i}.attn.proj": RowwiseParallel(),
                         f"blocks.{i}.mlp.0": ColwiseParallel(),
                         f"blocks.{i}.mlp.2": RowwiseParallel()})
        return plan

    def check_cp(self, config, degree: int) -> None:
        if config.seq_len % (2 * degree):
            raise ValueError(f"cp={degree} cuts each sequence into 2 x {degree} chunks (rank i "
                             f"holds chunks i and {2 * degree - 1}-i, so causal attention's "
                             f"work is even): seq_len {config.seq_len} must be a multiple of "
                             f"{2 * degree}")

    def cp_parts(self, model: nn.Module) -> tuple[list[nn.Module], nn.Module]:
        return [block.attn for block in model.blocks], model.pos

    def layers(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        return [("", GPTEmbedding(model)),
                *((f"blocks.{i}", block) for i, block in enumerate(model.blocks)),
                ("norm", model.norm), ("head", model.head)]

    def fsdp_units(self, module: nn.Module) -> list[nn.Module]:
        return [m for m in module.modules() if isinstance(m, Block) and m is not module]

    def check_checkpointing(self, config) -> None:
        pass  # every block is a checkpoint unit

    def checkpoint_units(self, module: nn.Module) -> list[nn.Module]:
        # A block saves several (batch, seq, d_model) tensors and two 4x-wide ones (norms,
        # qkv, attention, the MLP's hidden layer); checkpointed, only its input.
        return [m for m in module.modules() if isinstance(m, Block) and m is not module]

    def to_tp_layout(self, name: str, tensor: torch.Tensor, tp: int) -> torch.Tensor:
        if tp > 1 and name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            return tensor[_heads_order(tensor.shape[0], tp)]
        return tensor

    def from_tp_layout(self, name: str, tensor: torch.Tensor, tp: int) -> torch.Tensor:
        if tp > 1 and name.endswith(("attn.qkv.weight", "attn.qkv.bias")):
            out = torch.empty_like(tensor)
            out[_heads_order(tensor.shape[0], tp)] = tensor
            return out
        return tensor
