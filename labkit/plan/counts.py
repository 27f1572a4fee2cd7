"""What one sample costs a zoo model, counted on tensors that hold no data.

* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward of the
  model built on the meta device (shapes only), one sample (FLOPs are linear in the batch).
  With activation checkpointing the blocks' forward runs twice: their forward FLOPs are
  counted again (PyTorch's counter sees the recomputation only when it runs).
* Bytes read and written by memory-bound ops: embedding lookups (``aten.embedding``: the rows
  gathered) and their backward (``embedding_dense_backward``: a gradient of the whole table
  written). A recommender's tables are costed this way, not in FLOPs.
* Per block (the GPT): parameters and saved activations on one tp rank (``blocks.py``); ops
  dispatched and the optimizer's bytes (``op_counts.py``). Both are named here too.

Everything is cached per config: a 70B decoder is counted once (a few seconds on 2 cores).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from labkit.models import DLRMConfig, GPTConfig, build_model, example_batch, loss_fn
from labkit.models.gpt import Block
from labkit.plan.blocks import (  # noqa: F401 (counted per block, named here too)
    BlockCounts,
    block_counts,
    local_block_linears,
    rest_saved_bytes,
)
from labkit.plan.op_counts import (  # noqa: F401 (named here too)
    OpBytes,
    _is_view,
    _nbytes,
    forward_backward_ops,
    optimizer_counts,
    param_tensors,
)

_ATEN = torch.ops.aten


@dataclass(frozen=True)
class SampleCounts:
    """One sample's counted costs on one device (no parallelism).

    Attributes:
        forward_flops, backward_flops: FLOPs of one sample's forward and backward.
        block_forward_flops: the blocks' share of the forward (recomputed by checkpointing).
        lookup_bytes: bytes embedding lookups read, and their backward writes, per sample.
        table_bytes: bytes of the embedding tables' dense gradients written per step (a
            dense ``nn.Embedding`` gradient is the whole table, whatever the batch).
        params: parameter count.
    """

    forward_flops: float
    backward_flops: float
    block_forward_flops: float
    lookup_bytes: float
    table_bytes: float
    params: int
    other_bytes: float = 0.0  # read + written by the other non-matmul ops, per sample
    # read + written by attention's math path (ops on (batch, head, seq, seq) scores: mask,
    # softmax and their backward), per sample: a fused (flash) kernel never writes them
    attention_bytes: float = 0.0
    # the part of other_bytes moved by ops on the logits (a decoder's (..., vocab) tensors:
    # the loss's softmax and its backward), per sample
    logits_bytes: float = 0.0

    @property
    def flops(self) -> float:
        return self.forward_flops + self.backward_flops


# Ops whose cost is their FLOPs (FlopCounterMode counts them); every other op is costed by
# the bytes it reads and writes.
_MATMULS = {_ATEN.mm.default, _ATEN.addmm.default, _ATEN.bmm.default, _ATEN.baddbmm.default}


def _touches_logits(value, vocab: int) -> bool:
    """Whether an op's tensors include logits: (..., vocab) with a batch or sequence axis."""
    if isinstance(value, torch.Tensor):
        return value.dim() >= 2 and value.shape[-1] == vocab
    if isinstance(value, list | tuple):
        return any(_touches_logits(v, vocab) for v in value)
    return False


def _touches_scores(value, seq: int) -> bool:
    """Whether an op's tensors include attention scores: (batch, head, seq, seq) or the
    (seq, seq) causal mask."""
    if isinstance(value, torch.Tensor):
        return value.dim() in (2, 4) and tuple(value.shape[-2:]) == (seq, seq)
    if isinstance(value, list | tuple):
        return any(_touches_scores(v, seq) for v in value)
    return False


class _EmbeddingBytes(TorchDispatchMode):
    """Sums the bytes of embedding lookups' outputs (rows read) and of their backward, and
    the bytes every other non-matmul op reads and writes (elementwise, norms, softmax); the
    ops on attention scores (``seq`` x ``seq``) apart, in ``attention``."""

    def __init__(self, seq: int = 0, vocab: int = 0):
        super().__init__()
        self.lookup = 0
        self.table = 0
        self.other = 0
        self.attention = 0
        self.logits = 0  # the part of ``other`` on (..., vocab) tensors
        self.seq, self.vocab = seq, vocab

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        embedding = (_ATEN.embedding.default, _ATEN.embedding_dense_backward.default)
        if func not in _MATMULS and func not in embedding and not _is_view(func):
            if self.seq > 1 and _touches_scores((args, out), self.seq):
                self.attention += _nbytes(args) + _nbytes(out)
            else:
                moved = _nbytes(args) + _nbytes(out)
                self.other += moved
                if self.vocab and _touches_logits((args, out), self.vocab):
                    self.logits += moved
        if func is _ATEN.embedding.default:
            self.lookup += out.numel() * out.element_size()
        elif func is _ATEN.embedding_dense_backward.default:
            rows = args[0]  # the gradient of the rows looked up: read, added into the table
            self.lookup += rows.numel() * rows.element_size()
            self.table += out.numel() * out.element_size()
        return out


def _block_names(model: nn.Module) -> tuple[str, ...]:
    return tuple(name for name, m in model.named_modules() if isinstance(m, Block))


@functools.lru_cache(maxsize=64)
def sample_counts(model_config) -> SampleCounts:
    """FLOPs and memory-bound bytes of one sample of ``model_config`` (cached).

    A decoder's blocks are identical: it is counted with one block and with two, and the
    difference scaled to its ``n_layers`` (``tests/test_plan.py`` checks this equals the count
    of the whole model)."""
    if is_decoder(model_config) and model_config.n_layers > 2:
        one = traced_sample_counts(dataclasses.replace(model_config, n_layers=1))
        two = traced_sample_counts(dataclasses.replace(model_config, n_layers=2))
        extra = model_config.n_layers - 1
        return SampleCounts(*(a + (b - a) * extra for a, b in zip(
            dataclasses.astuple(one), dataclasses.astuple(two), strict=True)))
    return traced_sample_counts(model_config)


@functools.lru_cache(maxsize=64)
def traced_sample_counts(model_config) -> SampleCounts:
    """``sample_counts`` of the whole model, counted in one pass (no scaling)."""
    model = build_model(model_config, device="meta")
    inputs, targets = example_batch(model_config, 1, device="meta")
    blocks = _block_names(model)
    forward, backward = FlopCounterMode(display=False), FlopCounterMode(display=False)
    lookups = _EmbeddingBytes(getattr(model_config, "seq_len", 0),
                              getattr(model_config, "vocab_size", 0) if is_decoder(model_config)
                              else 0)
    with lookups:
        with forward:
            loss = loss_fn(model_config)(model(inputs), targets)
        with backward:
            loss.backward()
    counts = forward.get_flop_counts()
    block_flops = sum(sum(counts.get(f"GPT.{name}", {}).values()) for name in blocks)
    params = sum(p.numel() for p in model.parameters())
    # the dense table gradient is per step; lookups are per sample (batch of 1 here)
    return SampleCounts(forward.get_total_flops(), backward.get_total_flops(), block_flops,
                        lookups.lookup, lookups.table, params, lookups.other,
                        lookups.attention, lookups.logits)


def is_decoder(model_config) -> bool:
    return isinstance(model_config, GPTConfig)


def is_recommender(model_config) -> bool:
    return isinstance(model_config, DLRMConfig)
