"""Pipelines written by hand, for teaching: GPipe and 1F1B over send and recv.

Stage s of p (the rank at pipeline coordinate s) runs each micro-batch's forward: receive the
activation from stage s-1 (the first stage takes its slice of the inputs), run its layers,
send the output to stage s+1 (the last stage computes the loss instead). A backward runs the
other way: receive the gradient of the output from stage s+1 (the last stage starts from its
loss), backpropagate, send the gradient of the input to stage s-1. The schedules differ only
in the order of these two steps:

* GPipe (Huang et al., 2019): every forward, then every backward. A stage holds the
  activations of all m micro-batches at once.
* 1F1B (Narayanan et al., 2019; Megatron-LM's order): p - s - 1 forwards to fill the
  pipeline (warm-up), then one forward and one backward in turn, then the backwards left
  (cool-down). A stage holds at most p - s micro-batches at once.

With one micro-batch both are the naive pipeline: while one stage works, all the others wait.
That idle time is the bubble, (p-1)/(m+p-1) of a step of m equal micro-batches, which more
micro-batches shrink. The micro-batches' gradients add up, and the stage divides them by m at
the end of the step, so that they are the batch's.

torch.distributed.pipelining runs the same orders (``ScheduleGPipe``, ``Schedule1F1B`` over a
``PipelineStage``: ``schedule.py``); ``tests/test_pipeline_parallel.py`` checks that both
give the same losses, in the same order of forwards and backwards.
"""

from __future__ import annotations

from collections import deque

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from labkit.parallel.pipeline.p2p import StageLinks


class HandStage:
    """One stage's work on one micro-batch, under the names torch's ``PipelineStage`` gives
    it: ``forward_one_chunk``, ``backward_one_chunk``, ``scale_grads``."""

    def __init__(self, module: nn.Module, stage_index: int, num_stages: int,
                 micro_batches: int, loss_fn):
        self.module, self.stage_index, self.num_stages = module, stage_index, num_stages
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.micro_batches, self.loss_fn = micro_batches, loss_fn

    def forward_one_chunk(self, chunk: int, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def backward_one_chunk(self, chunk: int, x: torch.Tensor, out: torch.Tensor,
                           grad: torch.Tensor | None) -> torch.Tensor | None:
        """Backpropagate micro-batch ``chunk`` from ``out`` (the loss, on the last stage)
        with ``grad``, the gradient of ``out`` (None for a loss); the gradient of the input
        ``x``, or None where ``x`` is data."""
        if isinstance(self.module, FSDPModule):  # data parallel: reduce at the last only
            last = chunk == self.micro_batches - 1
            self.module.set_is_last_backward(last)
            self.module.set_reshard_after_backward(last)
            self.module.set_requires_gradient_sync(last)
        torch.autograd.backward(out, grad)
        return x.grad if x.requires_grad else None

    def scale_grads(self) -> None:
        """The sum over micro-batches made the mean: the batch's gradient."""
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(self.micro_batches)


def gpipe(stage: HandStage, links: StageLinks, inputs, targets) -> list[torch.Tensor]:
    """One GPipe step of this stage: every forward, then every backward. ``inputs`` are the
    first stage's micro-batches, ``targets`` the last stage's (None elsewhere). Returns the
    last stage's loss of each micro-batch ([] elsewhere)."""
    held, losses = deque(), []  # (input, output): what each backward needs
    for chunk in range(stage.micro_batches):
        held.append(forward_step(stage, links, chunk, inputs, targets, losses))
    for chunk in range(stage.micro_batches):
        backward_step(stage, links, chunk, *held.popleft())
    links.wait()  # every activation and gradient sent has arrived
    stage.scale_grads()
    return losses


def one_f_one_b(stage: HandStage, links: StageLinks, inputs, targets) -> list[torch.Tensor]:
    """One 1F1B step of this stage: warm-up forwards, then one forward and one backward in
    turn, then the backwards left. Arguments and result as ``gpipe``'s."""
    m = stage.micro_batches
    warmup = min(m, stage.num_stages - stage.stage_index - 1)
    held, losses = deque(), []
    for chunk in range(warmup):  # fill the pipeline
        held.append(forward_step(stage, links, chunk, inputs, targets, losses))
    for chunk in range(m - warmup):  # steady: the newest forward, the oldest backward
        held.append(forward_step(stage, links, warmup + chunk, inputs, targets, losses))
        backward_step(stage, links, chunk, *held.popleft())
    for chunk in range(m - warmup, m):  # drain it
        backward_step(stage, links, chunk, *held.popleft())
    links.wait()  # every activation and gradient sent has arrived
    stage.scale_grads()
    return losses


def forward_step(stage, links, chunk, inputs, targets, losses) -> tuple:
    """Micro-batch ``chunk`` through this stage: its input, and its output (the loss on the
    last stage)."""
    if stage.is_first:
        x = inputs[chunk]
    else:
        x = links.recv_forward()
        x.requires_grad_(x.is_floating_point())  # so that backward fills x.grad
    out = stage.forward_one_chunk(chunk, x)
    if stage.is_last:
        out = stage.loss_fn(out, targets[chunk])  # backward starts from the loss
        losses.append(out.detach())
    else:
        links.send_forward(out)
    return x, out


def backward_step(stage, links, chunk, x, out) -> None:
    """Micro-batch ``chunk`` back through this stage."""
    grad = None if stage.is_last else links.recv_backward(out)
    grad_x = stage.backward_one_chunk(chunk, x, out, grad)
    if not stage.is_first:
        links.send_backward(grad_x)


SCHEDULES = {"naive": gpipe, "naive_gpipe": gpipe, "naive_1f1b": one_f_one_b}
