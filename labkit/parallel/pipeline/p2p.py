"""What the hand-written pipelines send between neighbouring stages: activations forward,
their gradients back (``naive.py`` runs the schedules over these).

A stage receives with a blocking ``recv`` (it cannot compute before the tensor is there) and
sends with ``isend``: the send goes on while the stage computes its next micro-batch. Two
neighbours that send to each other at once (1F1B's steady phase: an activation forward, a
gradient back) so never wait for each other's receive. A stage waits for its last send in a
direction before it sends the next one that way (a tensor lives until it is sent: waiting
later would hold every micro-batch's), and for all of them at the end of the step.

An activation travels with a header (its dtype and shape: the receiver must allocate); a
gradient needs none, since it has the shape of the output the receiver sent. Every tensor
sent lives on the rank's device, the header included, so the same code runs over NCCL (which
moves device memory only) and gloo.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

_DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]


def send_tensor(tensor: torch.Tensor, dst: int, group=None) -> None:
    """Send the shape and dtype first (the receiver must allocate), then the data; ``dst``
    is a rank of ``group``. Everything sent is on ``tensor``'s device."""
    for part in _with_header(tensor):
        dist.send(part, group=group, group_dst=dst)


def recv_tensor(src: int, device: torch.device, group=None) -> torch.Tensor:
    """Receive what ``send_tensor`` (or ``StageLinks.send_forward``) sent from rank ``src``
    of ``group``, onto ``device``."""
    length = torch.empty(1, dtype=torch.long, device=device)
    dist.recv(length, group=group, group_src=src)
    header = torch.empty(int(length), dtype=torch.long, device=device)
    dist.recv(header, group=group, group_src=src)
    dtype, shape = _DTYPES[int(header[0])], [int(d) for d in header[2:]]
    tensor = torch.empty(shape, dtype=dtype, device=device)
    dist.recv(tensor, group=group, group_src=src)
    return tensor


def _with_header(tensor: torch.Tensor) -> list[torch.Tensor]:
    """The three messages of one tensor: the header's length, the header, the data."""
    header = torch.tensor([_DTYPES.index(tensor.dtype), tensor.dim(), *tensor.shape],
                          device=tensor.device)
    return [torch.tensor([len(header)], device=tensor.device), header, tensor.contiguous()]


class StageLinks:
    """A stage's links to the stage before it and the stage after it: ranks ``rank - 1`` and
    ``rank + 1`` of ``group``, its pipeline (``size`` stages)."""

    def __init__(self, rank: int, size: int, group, device: torch.device):
        self.rank, self.size, self.group, self.device = rank, size, group, device
        self._sending = {+1: [], -1: []}  # per direction: (work, tensor) not yet sent

    def recv_forward(self) -> torch.Tensor:
        """The activation from the stage before."""
        return recv_tensor(self.rank - 1, self.device, self.group)

    def send_forward(self, out: torch.Tensor) -> None:
        """This stage's output to the stage after (the graph stays here: ``detach``)."""
        self._isend(_with_header(out.detach()), +1)

    def recv_backward(self, out: torch.Tensor) -> torch.Tensor:
        """The gradient of ``out`` (this stage's output) from the stage after."""
        grad = torch.empty_like(out, memory_format=torch.contiguous_format)
        dist.recv(grad, group=self.group, group_src=self.rank + 1)
        return grad

    def send_backward(self, grad: torch.Tensor) -> None:
        """The gradient of this stage's input to the stage before."""
        self._isend([grad.contiguous()], -1)

    def wait(self, direction: int | None = None) -> None:
        """Every send (towards ``direction``, +1 or -1, or both) finished."""
        for way in (direction,) if direction else (+1, -1):
            for work, _ in self._sending[way]:
                work.wait()
            self._sending[way].clear()

    def _isend(self, parts: list[torch.Tensor], direction: int) -> None:
        self.wait(direction)
        dst = self.rank + direction
        self._sending[direction] = [(dist.isend(part, group=self.group, group_dst=dst), part)
                                    for part in parts]
