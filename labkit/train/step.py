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


def split_batch(value, parts: int) -> list:
    """Split a tensor, or a tuple of tensors, into ``parts`` equal chunks along the batch."""
    if isinstance(value, tuple):
        return list(zip(*(split_batch(v, parts) for v in value), strict=True))
    return list(value.chunk(parts))


def run_step(model: nn.Module, batch, loss_fn, optimizer: torch.optim.Optimizer,
             precision: str, sync_gradients=None, synchronize=None, micro_batches: int = 1,
             no_sync=None) -> dict:
    """forward -> backward (per micro-batch) -> gradient sync -> optimizer step.

    ``batch`` is (inputs, targets) already on the device. With ``micro_batches`` > 1 the
    batch is processed in that many chunks one after another and their gradients add up
    (gradient accumulation; each chunk's loss is scaled so the sum is the batch's mean).
    ``no_sync`` (DDP's) skips communication for all chunks but the last. ``synchronize``
    waits for the device (CUDA) so that phase times are real. Returns the loss and times.
    """
    sync_device = synchronize or (lambda: None)
    device_type = next(model.parameters()).device.type
    inputs, targets = batch
    chunks = zip(split_batch(inputs, micro_batches), split_batch(targets, micro_batches),
                 strict=True)
    forward_s = backward_s = 0.0
    total = None
    start = time.perf_counter()
    for i, (chunk_in, chunk_target) in enumerate(chunks):
        silent = no_sync is not None and i < micro_batches - 1
        with no_sync() if silent else contextlib.nullcontext():
            t0 = time.perf_counter()
            with (torch.autocast(device_type, dtype=torch.bfloat16) if precision == "mixed"
                  else contextlib.nullcontext()):
                output = model(_cast_inputs(chunk_in, precision))
                loss = loss_fn(output, _cast_inputs(chunk_target, precision)) / micro_batches
            del output
            sync_device()
            t1 = time.perf_counter()
            loss.backward()
            sync_device()
            t2 = time.perf_counter()
        forward_s, backward_s = forward_s + t1 - t0, backward_s + t2 - t1
        total = loss.detach() if total is None else total + loss.detach()
        del loss
    if sync_gradients is not None:
        sync_gradients()
    sync_device()
    t3 = time.perf_counter()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    sync_device()
    t4 = time.perf_counter()
    return {"loss": total, "forward_s": forward_s, "backward_s": backward_s,
            "sync_s": t3 - t2, "optimizer_s": t4 - t3, "step_s": t4 - start,
            "backward_end": t2}
