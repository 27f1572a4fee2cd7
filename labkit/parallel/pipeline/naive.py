"""A pipeline written by hand, for teaching: one batch at a time through the stages.

Stage r (the rank at pipeline coordinate r) runs: receive the activation from stage r-1, run
its layers, send the result to stage r+1; the last stage computes the loss. Backward runs the
other way: the last stage starts it, each stage sends the gradient of its input to stage r-1.
While one stage works, all the others wait: that idle time is the bubble that micro-batching
(GPipe, 1F1B) shrinks.

Every tensor sent lives on the rank's device, the shape header included, so the same code
runs over NCCL (which moves device memory only) and gloo.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def send_tensor(tensor: torch.Tensor, dst: int, group=None) -> None:
    """Send the shape and dtype first (the receiver must allocate), then the data; ``dst``
    is a rank of ``group``. Everything sent is on ``tensor``'s device."""
    header = torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape],
                          device=tensor.device)
    dist.send(torch.tensor([len(header)], device=tensor.device), group=group, group_dst=dst)
    dist.send(header, group=group, group_dst=dst)
    dist.send(tensor.contiguous(), group=group, group_dst=dst)


def recv_tensor(src: int, device: torch.device, group=None) -> torch.Tensor:
    """Receive what ``send_tensor`` sent from rank ``src`` of ``group``, onto ``device``."""
    length = torch.empty(1, dtype=torch.long, device=device)
    dist.recv(length, group=group, group_src=src)
    header = torch.empty(int(length), dtype=torch.long, device=device)
    dist.recv(header, group=group, group_src=src)
    dtype, shape = _DTYPES[int(header[0])], [int(d) for d in header[2:]]
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, group=group, group_src=src)
    return tensor


class NaivePipeline:
    """One stage of the hand-made pipeline; ``step`` mirrors a pipelining schedule's."""

    def __init__(self, stage: nn.Module, rank: int, world_size: int, device: torch.device,
                 loss_fn, timeline, group=None):
        self.stage, self.rank, self.world_size, self.device = stage, rank, world_size, device
        self.loss_fn, self.timeline, self.group = loss_fn, timeline, group

    def step(self, inputs=None, target=None, losses=None) -> None:
        first, last = self.rank == 0, self.rank == self.world_size - 1
        clock = self.timeline.clock
        x = (inputs if first
             else recv_tensor(self.rank - 1, self.device, self.group).requires_grad_())
        start = clock.mark()  # busy from here: the wait for the activation was idle time
        out = self.stage(x)
        if not last:
            send_tensor(out.detach(), self.rank + 1, self.group)
        self.timeline.record("F", 0, start, clock.mark(), self.rank)
        if last:
            loss = self.loss_fn(out, target)
            losses.append(loss.detach())
            grad = None
        else:
            grad = recv_tensor(self.rank + 1, self.device, self.group)
        start = clock.mark()  # busy from here
        (loss if last else out).backward(grad)
        if not first:
            send_tensor(x.grad, self.rank - 1, self.group)
        self.timeline.record("B", 0, start, clock.mark(), self.rank)
