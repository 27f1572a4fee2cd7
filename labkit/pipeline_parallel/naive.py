"""A pipeline written by hand, for teaching: one batch at a time through the stages.

Rank r holds stage r. Forward: receive the activation from rank r-1, run the stage, send
the result to rank r+1; the last rank computes the loss. Backward runs the other way: the last
rank starts it, each rank sends the gradient of its input to rank r-1. While one rank works,
all the others wait: that idle time is the bubble that micro-batching (GPipe, 1F1B) shrinks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labkit.pipeline_parallel.timeline import clock, record

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def send_tensor(tensor: torch.Tensor, dst: int) -> None:
    """Send the shape and dtype first (the receiver must allocate), then the data."""
    header = torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape])
    dist.send(torch.tensor([len(header)]), dst)
    dist.send(header, dst)
    dist.send(tensor.contiguous(), dst)


def recv_tensor(src: int, device: torch.device) -> torch.Tensor:
    length = torch.empty(1, dtype=torch.long)
    dist.recv(length, src)
    header = torch.empty(int(length), dtype=torch.long)
    dist.recv(header, src)
    dtype, shape = _DTYPES[int(header[0])], [int(d) for d in header[2:]]
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, src)
    return tensor


class NaivePipeline:
    """One stage of the hand-made pipeline; ``step`` mirrors a pipelining schedule's."""

    def __init__(self, stage: nn.Module, rank: int, world_size: int, device: torch.device,
                 loss_fn, events: list):
        self.stage, self.rank, self.world_size, self.device = stage, rank, world_size, device
        self.loss_fn, self.events = loss_fn, events

    def step(self, inputs=None, target=None, losses=None) -> None:
        first, last = self.rank == 0, self.rank == self.world_size - 1
        x = inputs if first else recv_tensor(self.rank - 1, self.device).requires_grad_()
        start = clock()  # busy from here: the wait for the activation was idle time
        out = self.stage(x)
        if not last:
            send_tensor(out.detach(), self.rank + 1)
        record(self.events, "F", 0, start, clock())
        if last:
            loss = self.loss_fn(out, target)
            losses.append(loss.detach())
            grad = None
        else:
            grad = recv_tensor(self.rank + 1, self.device)
        start = clock()  # busy from here
        (loss if last else out).backward(grad)
        if not first:
            send_tensor(x.grad, self.rank - 1)
        record(self.events, "B", 0, start, clock())
