"""How the zoo's GPT is split: each block's attention by heads (grouped-query attention by
key/value heads, each rank its whole groups) and its MLP by columns then rows (Megatron-LM,
section 3; SwiGLU's gate and up by columns, its down by rows), the chain embeddings -> blocks
-> norm -> head into pipeline stages, each block an FSDP unit."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.models.gpt import GPT, Block, SwiGLU
from labkit.models.split import ParallelPlan


class GPTEmbedding(nn.Module):
    """The first piece of a GPT's chain: token plus position embeddings."""

    def __init__(self, gpt: GPT):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos  # pos is None under rotary embeddings

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)  # (batch, seq, d_model)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x


def _heads_order(rows: int, tp: int) -> torch.Tensor:
    """Row order that turns qkv's [q; k; v] into [q_0 k_0 v_0; q_1 k_1 v_1; ...], so that an
    even split by rows gives tp rank r the q, k and v of its own heads."""
    return torch.arange(rows).view(3, tp, -1).transpose(0, 1).reshape(-1)


def block_styles(block: Block) -> dict:
    """One block's tp plan, by names inside the block: attention's fused qkv by columns (its
    heads) and its projection by rows; the MLP's first linear(s) by columns, the last by rows."""
    if isinstance(block.mlp, SwiGLU):
        mlp = {"mlp.gate": ColwiseParallel(), "mlp.up": ColwiseParallel(),
               "mlp.down": RowwiseParallel()}
    else:
        mlp = {"mlp.0": ColwiseParallel(), "mlp.2": RowwiseParallel()}
    return {"attn.qkv": ColwiseParallel(), "attn.proj": RowwiseParallel(), **mlp}


def _multi_head(name: str, tensor: torch.Tensor) -> bool:
    """Whether a qkv weight (or bias) is multi-head attention's [q; k; v] (3 x d_model rows),
    not grouped-query attention's groups (fewer). A bias alone does not say: grouped-query
    attention with biases is refused under tp (``check_tp``)."""
    return tensor.dim() == 1 or tensor.shape[0] == 3 * tensor.shape[1]


class GPTPlan(ParallelPlan):
    family = "gpt"
    splits_tensors = True

    def check_tp(self, config, degree: int) -> None:
        if config.n_heads % degree:
            raise ValueError(f"{config.n_heads} attention heads do not split over {degree} "
                             "ranks: choose a degree that divides n_heads")
        if config.kv_heads % degree:
            fits = [t for t in range(1, config.kv_heads + 1) if not config.kv_heads % t]
            raise ValueError(f"{config.kv_heads} key/value heads (n_kv_heads) do not split "
                             f"over tp={degree} ranks: each rank holds whole query groups, so "
                             f"tp must divide n_kv_heads ({config.kv_heads}): choose tp in {fits}")
        if config.bias and config.kv_heads != config.n_heads:
            raise ValueError("grouped-query attention splits over tp without biases here "
                             "(its fused qkv bias has no [q; k; v] shape to reorder by): use "
                             "bias=False, as Llama does")
        if config.ff_width % degree:
            raise ValueError(f"the MLP's {config.ff_width} hidden units (d_ff) do not split "
                             f"over tp={degree} ranks: choose a tp that divides d_ff")

    def check_pipeline(self, config, stages: int) -> None:
        if config.tie_embeddings and stages > 1:
            raise ValueError("tied embeddings share one weight between the first stage (the "
                             "token embedding) and the last (the head): a pipeline would put "
                             "it on two ranks; use tie_embeddings=False with pp")
        weighted = config.n_layers + 3  # embeddings, the blocks, the final norm, the head
        if weighted < stages:
            raise ValueError(f"the model has {weighted} layers with weights: it cannot fill "
                             f"{stages} stages; use fewer stages or more layers (n_layers >= "
                             f"{stages - 3})")

    def tp_styles(self, model: nn.Module) -> dict:
        return {f"blocks.{i}.{name}": style for i, block in enumerate(model.blocks)
                for name, style in block_styles(block).items()}

    def check_cp(self, config, degree: int) -> None:
        if config.position == "rope" or config.kv_heads != config.n_heads:
            raise ValueError("labkit's context parallelism shifts a learned position "
                             "embedding and rings multi-head attention's keys and values: "
                             "use position='learned' and n_kv_heads=None with cp")
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
        # grouped-query attention's rows are already one group after another (no reorder)
        if tp > 1 and name.endswith(("attn.qkv.weight", "attn.qkv.bias")) \
                and _multi_head(name, tensor):
            return tensor[_heads_order(tensor.shape[0], tp)]
        return tensor

    def from_tp_layout(self, name: str, tensor: torch.Tensor, tp: int) -> torch.Tensor:
        if tp > 1 and name.endswith(("attn.qkv.weight", "attn.qkv.bias")) \
                and _multi_head(name, tensor):
            out = torch.empty_like(tensor)
            out[_heads_order(tensor.shape[0], tp)] = tensor
            return out
        return tensor
