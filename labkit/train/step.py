"""One training step, phase by phase, timed; shared by real training and the estimator."""

from __future__ import annotations

import contextlib
import time

import torch
from torch import nn

OPTIMIZERS = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}


def make_optimizer(name: str, params, lr: float) -> torch.optim.Optimizer:
    # foreach=False: one parameter at a time, on every device, so that the memory of the step
    # is the same on CPU and GPU (the foreach path holds temporaries for all tensors at once).
    return OPTIMIZERS[name](params, lr=lr, foreach=False)


def weight_dtype(precision: str) -> torch.dtype:
    """bf16 keeps weights in bfloat16; fp32 and mixed (autocast) keep them in float32."""
    return torch.bfloat16 if precision == "bf16" else torch.float32


def _cast_inputs(value, precision: str):
    if isinstance(value, tuple):
        return tuple(_cast_inputs(v, precision) for v in value)
    if precision == "bf16" and value.is_floating_point():
        return value.to(torch.bfloat16)
    return value


def run_step(model: nn.Module, batch, loss_fn, optimizer: torch.optim.Optimizer,
             precision: str, sync_gradients=None, synchronize=None) -> dict:
    """forward -> backward -> gradient sync -> optimizer step; returns the loss and phase times.

    ``batch`` is (inputs, targets) already on the device. ``synchronize`` waits for the device
    (CUDA) so that phase times are real.
    """
    sync_device = synchronize or (lambda: None)
    autocast = (torch.autocast(next(model.parameters()).device.type, dtype=torch.bfloat16)
                if precision == "mixed" else contextlib.nullcontext())
    inputs, targets = batch
    t0 = time.perf_counter()
    with autocast:
        loss = loss_fn(model(_cast_inputs(inputs, precision)), _cast_inputs(targets, precision))
    sync_device()
    t1 = time.perf_counter()
    loss.backward()
    sync_device()
    t2 = time.perf_counter()
    if sync_gradients is not None:
        sync_gradients()
    sync_device()
    t3 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync_device()
    t4 = time.perf_counter()
    return {"loss": loss.detach(), "forward_s": t1 - t0, "backward_s": t2 - t1,
            "sync_s": t3 - t2, "optimizer_s": t4 - t3, "step_s": t4 - t0,
            "backward_end": t2}
