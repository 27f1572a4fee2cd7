"""Ops a step dispatches and the bytes they move, counted on tensors that hold no data: the
optimizer's passes over its state (``optimizer_counts``), a sample's forward and backward ops
as a real device dispatches them (``forward_backward_ops``: attention as one fused kernel, not
meta's math path), and the parameter tensors (``param_tensors``)."""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from labkit.models import build_model, example_batch, loss_fn


def _nbytes(value) -> int:
    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, list | tuple):
        return sum(_nbytes(v) for v in value)
    return 0


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
