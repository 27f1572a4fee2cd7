"""One decoder block on one tp rank, counted on meta tensors: its parameters and the bytes
autograd saves for backward per sample (``block_counts``), the widths of its linears, and what
the rest of the model (embeddings, final norm, head, loss) saves (``rest_saved_bytes``). The
block is built with each rank's local shapes: every linear the model's tp plan
(``GPTPlan.tp_styles``) names colwise keeps 1/tp of its outputs, rowwise 1/tp of its inputs,
the shapes DTensor's plan gives a rank."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn

from labkit.models import GPTConfig, build_model, example_batch, loss_fn
from labkit.models.gpt import Block
from labkit.plan.fused_saves import GPUKernelSaves


@dataclass(frozen=True)
class BlockCounts:
    """One GPT block on one tp rank: its parameters and what autograd saves per sample."""

    params: int  # this rank's parameters of one block
    full_params: int  # the block's parameters before the split
    saved_bytes: float  # bytes saved for backward per sample (fp32 compute), one block
    input_bytes: float  # the block's input per sample (what checkpointing keeps)
    # of saved_bytes, the tensors d_model wide (norms' and residuals' inputs): every tp rank
    # holds them whole; sequence parallelism splits them over the tp ranks
    full_width_bytes: float = 0.0


def _local_block(config: GPTConfig, tp: int) -> nn.Module:
    """A block with one tp rank's shapes: each linear of the block's tp plan
    (``gpt_split.block_styles``) keeps 1/tp of its outputs (colwise) or of its inputs
    (rowwise), as DTensor's plan gives a rank."""
    from torch.distributed.tensor.parallel import ColwiseParallel

    from labkit.models.gpt_split import block_styles

    with torch.device("meta"):
        block = Block(config)
        for name, style in block_styles(block).items():
            parent, _, leaf = name.rpartition(".")
            old = block.get_submodule(name)
            colwise = isinstance(style, ColwiseParallel)
            local = nn.Linear(old.in_features if colwise else old.in_features // tp,
                              old.out_features // tp if colwise else old.out_features,
                              bias=old.bias is not None)
            setattr(block.get_submodule(parent), leaf, local)
    return block


def local_block_linears(config: GPTConfig, tp: int = 1) -> list[int]:
    """Output widths of one block's linears on a tp rank, in the order forward runs them."""
    block = _local_block(config, tp)
    return [m.out_features for m in block.modules() if isinstance(m, nn.Linear)]


@functools.lru_cache(maxsize=64)
def block_counts(config: GPTConfig, tp: int = 1, flash_attention: bool = False,
                 fused_saves: bool = False) -> BlockCounts:
    """Parameters and saved activations of one block of ``config`` on one of ``tp`` ranks.

    ``flash_attention`` (a GPU's kernels): leave out the (seq x seq) attention weights that
    PyTorch's math attention saves (CPU, meta); a GPU's fused attention keeps one row
    statistic instead (FlashAttention; Dao et al., 2022): counted as (heads, seq) floats.
    ``fused_saves``: RMSNorm and grouped-query attention save what their fused kernels keep
    (``fused_saves.GPUKernelSaves``), not what meta's composite ops do."""
    block = _local_block(config, tp)
    full = sum(p.numel() for p in _local_block(config, 1).parameters())
    weights = {p.untyped_storage()._cdata for p in block.parameters()}
    seen: set[int] = set()
    saved = wide = 0

    def pack(t: torch.Tensor):
        nonlocal saved, wide
        storage = t.untyped_storage()
        if storage._cdata not in seen | weights:  # weights are state, not activations
            seen.add(storage._cdata)  # views of one storage (q, k, v of qkv) count once
            square = t.dim() >= 2 and t.shape[-1] == t.shape[-2] == config.seq_len
            if flash_attention and square:
                saved += storage.nbytes() // config.seq_len // t.element_size() * 4
            else:
                saved += storage.nbytes()
                if tp > 1 and not square and storage.nbytes() == t.numel() * t.element_size() \
                        and t.shape[-1] == config.d_model:
                    wide += storage.nbytes()
        return t

    x = torch.zeros(1, config.seq_len, config.d_model, device="meta", requires_grad=True)
    kernels = GPUKernelSaves() if fused_saves else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), kernels:
        block(x)
    params = sum(p.numel() for p in block.parameters())
    return BlockCounts(params, full, saved, x.numel() * x.element_size(), wide)


@functools.lru_cache(maxsize=64)
def rest_saved_bytes(config: GPTConfig) -> float:
    """Bytes saved for backward per sample outside the blocks (embeddings, final norm, head,
    loss): a one-block model's, less its block's."""
    model = build_model(dataclasses.replace(config, n_layers=1), device="meta")
    inputs, targets = example_batch(config, 1, device="meta")
    seen: set[int] = set()
    weights = {p.untyped_storage()._cdata for p in model.parameters()}
    saved = 0

    def pack(t):
        nonlocal saved
        storage = t.untyped_storage()
        if storage._cdata not in seen | weights:  # weights are state, not activations
            seen.add(storage._cdata)
            saved += storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_fn(config)(model(inputs), targets)
    return float(saved) - block_counts(config, 1).saved_bytes
