"""What one sample costs a zoo model, counted on tensors that hold no data.

* FLOPs: ``torch.utils.flop_counter.FlopCounterMode`` over one forward and backward of the
  model built on the meta device (shapes only), one sample (FLOPs are linear in the batch).
  With activation checkpointing the blocks' forward runs twice: their forward FLOPs are
  counted again (PyTorch's counter sees the recomputation only when it runs).
* Bytes read and written by memory-bound ops: embedding lookups (``aten.embedding``: the rows
  gathered) and their backward (``embedding_dense_backward``: a gradient of the whole table
  written). A recommender's tables are costed this way, not in FLOPs.
* Per block (the GPT): parameters and the bytes autograd saves for backward per sample, for a
  block split over ``tp`` ranks: the block is built with each rank's local shapes (qkv
  3d/tp columns, proj d/tp rows, the MLP 4d/tp), the shapes DTensor's plan gives a rank.

Everything is cached per config: a 70B decoder is counted once (a few seconds on 2 cores).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from labkit.models import DLRMConfig, GPTConfig, build_model, example_batch, loss_fn
from labkit.models.gpt import Block

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

    @property
    def flops(self) -> float:
        return self.forward_flops + self.backward_flops


# Ops whose cost is their FLOPs (FlopCounterMode counts them); every other op is costed by
# the bytes it reads and writes.
_MATMULS = {_ATEN.mm.default, _ATEN.addmm.default, _ATEN.bmm.default, _ATEN.baddbmm.default}


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


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

    def __init__(self, seq: int = 0):
        super().__init__()
        self.lookup = 0
        self.table = 0
        self.other = 0
        self.attention = 0
        self.seq = seq

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        embedding = (_ATEN.embedding.default, _ATEN.embedding_dense_backward.default)
        if func not in _MATMULS and func not in embedding and not _is_view(func):
            if self.seq > 1 and _touches_scores((args, out), self.seq):
                self.attention += _nbytes(args) + _nbytes(out)
            else:
                self.other += _nbytes(args) + _nbytes(out)
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
    lookups = _EmbeddingBytes(getattr(model_config, "seq_len", 0))
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
                        lookups.attention)


class OpBytes(TorchDispatchMode):
    """Counts the non-view ops and the bytes they read and write (tensor arguments and
    results)."""

    def __init__(self):
        super().__init__()
        self.bytes = 0
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not _is_view(func) and func._schema.name.startswith("aten::"):
            self.ops += 1
            self.bytes += _nbytes(args) + _nbytes(kwargs and list(kwargs.values())) + _nbytes(out)
        return out


@functools.lru_cache(maxsize=8)
def optimizer_counts(optimizer: str) -> tuple[float, float]:
    """(bytes an optimizer step reads and writes per byte of the parameters it updates, ops
    it dispatches per parameter tensor), counted on the op stream of labkit's optimizer
    (``labkit.models.optim``) over a small layer. Each pass over parameters, gradients and state is
    one more array's bytes: torch's Adam touches 19 (its lerp, mul, addcmul, sqrt, div, add
    and addcdiv), SGD 3. The step after the first is counted (the first creates the state).
    The optimizer runs once per step, whatever the micro-batches."""
    from labkit.models.optim import make_optimizer

    layer = nn.Linear(64, 64)
    params = list(layer.parameters())
    step = make_optimizer(optimizer, params, 1e-3)
    for p in params:
        p.grad = torch.ones_like(p)
    step.step()
    counter = OpBytes()
    with counter:
        step.step()
    weight_bytes = sum(p.numel() * p.element_size() for p in params)
    return counter.bytes / weight_bytes, counter.ops / len(params)


class _OpCount(TorchDispatchMode):
    """Counts every op dispatched (views too: each costs a dispatch), except while muted."""

    def __init__(self):
        super().__init__()
        self.n, self.muted = 0, False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += not self.muted
        return func(*args, **(kwargs or {}))


class _FusedAttention(torch.autograd.Function):
    """Stands, while ops are counted on meta tensors, for the fused kernel a CPU (or GPU)
    runs: one op forward and one backward. On meta, ``scaled_dot_product_attention`` takes
    its math path (bmm, mask, softmax, dropout: 41 ops a layer forward and backward on the
    classroom GPT), which a real device never dispatches."""

    @staticmethod
    def forward(ctx, counter, q, k, v):  # q, k: (..., L, E); v: (..., S, Ev)
        ctx.counter, ctx.shapes = counter, (q, k, v)
        counter.n, counter.muted = counter.n + 1, True
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        counter.muted = False
        return out

    @staticmethod
    def backward(ctx, grad):
        counter = ctx.counter
        counter.n, counter.muted = counter.n + 1, True
        grads = tuple(torch.empty_like(t) for t in ctx.shapes)
        counter.muted = False
        return (None, *grads)


class _CountFusedAttention(TorchFunctionMode):
    def __init__(self, counter: _OpCount):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        fused = func is nn.functional.scaled_dot_product_attention and not (
            kwargs.get("attn_mask") is not None or kwargs.get("dropout_p", 0.0) > 0)
        if fused and len(args) == 3:
            return _FusedAttention.apply(self.counter, *args)
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=64)
def forward_backward_ops(model_config) -> int:
    """Ops one sample's forward + backward dispatches on a real device, counted on meta
    tensors; attention counted as the fused kernel a device runs (``_FusedAttention``), not
    meta's math path."""
    model = build_model(model_config, device="meta")
    inputs, targets = example_batch(model_config, 1, device="meta")
    counter = _OpCount()
    with _CountFusedAttention(counter), counter:
        loss_fn(model_config)(model(inputs), targets).backward()
    return counter.n


@functools.lru_cache(maxsize=64)
def param_tensors(model_config) -> int:
    """Parameter tensors of the whole model (counted on meta tensors)."""
    return len(list(build_model(model_config, device="meta").parameters()))


def _is_view(func) -> bool:
    return any(a.alias_info is not None and not a.alias_info.is_write
               for a in func._schema.returns)


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
    """A block with one tp rank's shapes (the split of ``GPTPlan.tp_styles``)."""
    with torch.device("meta"):
        block = Block(config)
        d = config.d_model
        block.attn.qkv = nn.Linear(d, 3 * d // tp)
        block.attn.proj = nn.Linear(d // tp, d)
        block.mlp[0] = nn.Linear(d, 4 * d // tp)
        block.mlp[2] = nn.Linear(4 * d // tp, d)
    return block


def local_block_linears(config: GPTConfig, tp: int = 1) -> list[int]:
    """Output widths of one block's linears on a tp rank, in the order forward runs them."""
    block = _local_block(config, tp)
    return [m.out_features for m in block.modules() if isinstance(m, nn.Linear)]


@functools.lru_cache(maxsize=64)
def block_counts(config: GPTConfig, tp: int = 1, flash_attention: bool = False) -> BlockCounts:
    """Parameters and saved activations of one block of ``config`` on one of ``tp`` ranks.

    ``flash_attention``: leave out the (seq x seq) attention weights that PyTorch's math
    attention saves (CPU, meta); a GPU's fused attention keeps one row statistic instead
    (FlashAttention; Dao et al., 2022): counted as (heads, seq) floats."""
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
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        block(x)
    params = sum(p.numel() for p in block.parameters())
    return BlockCounts(params, full, saved, x.numel() * x.element_size(), wide)


def is_decoder(model_config) -> bool:
    return isinstance(model_config, GPTConfig)


def is_recommender(model_config) -> bool:
    return isinstance(model_config, DLRMConfig)


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
