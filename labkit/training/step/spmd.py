"""One training step of a layout without a pipeline, phase by phase, timed; shared by real
training and the estimator (which runs it on fake tensors)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from labkit.runtime.comm.clock import HostClock


def _cast_inputs(value, precision: str):
    if isinstance(value, tuple):
        return tuple(_cast_inputs(v, precision) for v in value)
    if precision == "bf16" and value.is_floating_point():
        return value.to(torch.bfloat16)
    return value


def micro_steps(config) -> int:
    """Forward-backward passes per optimizer step: gradient accumulation's micro-steps (and
    the micro_batches that do the same without a pipeline)."""
    return config.micro_batches * config.grad_accumulation


def step_precision(config, built) -> str:
    """What the step itself casts: nothing where FSDP2's policy already runs in bfloat16."""
    return "fp32" if built.engine_casts else config.precision


def split_batch(value, parts: int) -> list:
    """Split a tensor, or a tuple of tensors, into ``parts`` equal chunks along the batch."""
    if isinstance(value, tuple):
        return list(zip(*(split_batch(v, parts) for v in value), strict=True))
    return list(value.chunk(parts))


def run_step(model: nn.Module, batch, loss_fn, optimizer: torch.optim.Optimizer,
             precision: str, sync_gradients=None, clock=None, micro_batches: int = 1,
             no_sync=None) -> dict:
    """forward -> backward (per micro-batch) -> gradient sync -> optimizer step.

    ``batch`` is (inputs, targets) already on the device. With ``micro_batches`` > 1 the
    batch is processed in that many chunks one after another and their gradients add up
    (gradient accumulation; each chunk's loss is scaled so the sum is the batch's mean).
    ``no_sync`` (a context) skips gradient communication for all chunks but the last.
    ``clock.now()`` waits for the device at each phase boundary (``runtime/comm/clock.py``), so that
    phase times are the device's. Returns the loss and the times.
    """
    clock = clock or HostClock()
    device_type = next(model.parameters()).device.type
    inputs, targets = batch
    chunks = zip(split_batch(inputs, micro_batches), split_batch(targets, micro_batches),
                 strict=True)
    forward_s = backward_s = 0.0
    total = None
    start = t2 = clock.now()
    for i, (chunk_in, chunk_target) in enumerate(chunks):
        silent = no_sync is not None and i < micro_batches - 1
        with no_sync() if silent else contextlib.nullcontext():
            t0 = clock.now()
            with (torch.autocast(device_type, dtype=torch.bfloat16) if precision == "mixed"
                  else contextlib.nullcontext()):
                output = model(_cast_inputs(chunk_in, precision))
                loss = loss_fn(output, _cast_inputs(chunk_target, precision)) / micro_batches
            del output
            t1 = clock.now()
            loss.backward()
            t2 = clock.now()
        forward_s, backward_s = forward_s + t1 - t0, backward_s + t2 - t1
        total = loss.detach() if total is None else total + loss.detach()
        del loss
    if sync_gradients is not None:
        sync_gradients()
    t3 = clock.now()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    t4 = clock.now()
    return {"loss": total, "forward_s": forward_s, "backward_s": backward_s,
            "sync_s": t3 - t2, "optimizer_s": t4 - t3, "step_s": t4 - start,
            "backward_end": t2}
