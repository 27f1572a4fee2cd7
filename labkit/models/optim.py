"""The optimizers training uses and the dtype weights are kept in (shared by every layout and
by the estimator, which runs the same step on fake tensors)."""

from __future__ import annotations

import torch

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    # foreach=False: one parameter at a time, on every device, so that the memory of the step
    # is the same on CPU and GPU (the foreach path holds temporaries for all tensors at once).
    return OPTIMIZERS[name](params, lr=lr, foreach=False)


def weight_dtype(precision: str) -> torch.dtype:
    """bf16 keeps weights in bfloat16; fp32 and mixed (autocast) keep them in float32."""
    return torch.bfloat16 if precision == "bf16" else torch.float32
