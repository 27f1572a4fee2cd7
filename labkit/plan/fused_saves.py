"""What a GPU's fused kernels keep for backward, stood in for while a block's saved tensors
are counted on meta tensors (``blocks.block_counts`` with ``fused_saves``, where the
framework's kernels are fused: ``frameworks.Framework.fused_saves``). On meta,
RMSNorm and grouped-query attention take composite paths that save more than a GPU keeps:

* RMSNorm: the composite path saves its input, the normalized input and its inverse RMS;
  the fused kernel (``torch.rms_norm`` on CUDA, Apex's and Transformer Engine's) saves the
  input and the inverse RMS (one float per row) and recomputes the rest in backward.
* Grouped-query attention: the math path repeats each key/value head for its query group
  and saves the copies; FlashAttention-2 reads the key/value heads as they are and saves
  q, k, v, its output and one log-sum-exp per row (Dao 2023, Algorithm 1 and 2).

Multi-head attention is left to the math path (its copies are within 2% of FlashAttention's
saved set at the zoo's shapes; ``block_counts`` keeps one row statistic for its scores)."""

from __future__ import annotations

import torch
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode


class _RMSNormSaves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight):  # x (..., d_model)
        inverse_rms = x.new_empty(x.shape[:-1] + (1,), dtype=torch.float32)
        ctx.save_for_backward(x, inverse_rms)
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad):
        x, _ = ctx.saved_tensors
        return torch.empty_like(x), None


class _FlashSaves(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v):  # q (batch, heads, seq, d_head); k, v (batch, kv_heads, ...)
        out = q.new_empty(q.shape[:-1] + v.shape[-1:])
        log_sum_exp = q.new_empty(q.shape[:-1], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, log_sum_exp)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


class GPUKernelSaves(TorchFunctionMode):
    """While active, ``F.rms_norm`` and grouped-query ``scaled_dot_product_attention`` save
    what their fused GPU kernels keep (the module docstring); every other op runs as is."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.rms_norm:
            weight = args[2] if len(args) > 2 else kwargs.get("weight")
            return _RMSNormSaves.apply(args[0], weight)
        if func is F.scaled_dot_product_attention and len(args) == 3 \
                and args[1].shape[1] != args[0].shape[1]:
            return _FlashSaves.apply(*args)
        return func(*args, **kwargs)
