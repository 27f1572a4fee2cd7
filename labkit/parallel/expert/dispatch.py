"""Tokens to their experts and back: two all-to-alls (GShard, Lepikhin et al. 2020).

Each rank of the expert-parallel group (the data-parallel ranks) holds n_experts / N experts
and its own tokens. A MoE layer fills one buffer per rank, (n_experts, slots, d_model), its
tokens in the slots of the experts they chose. Dispatch: block j of the buffer (rank j's
experts) goes to rank j, so each rank receives, from every rank, the tokens for its experts;
it runs its experts on them; combine: the outputs go back the same way. In backward the two
all-to-alls run again in reverse (an all-to-all's gradient is an all-to-all).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


class AllToAll(torch.autograd.Function):
    """dim 0 cut into N equal blocks, block j sent to rank j, block i of the result received
    from rank i. Backward: the same on the gradient (each block goes back where it came)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x.contiguous(), group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad.contiguous(), group=ctx.group)
        return out, None


class ExpertExchange:
    """What a MoE layer calls instead of running every expert locally: dispatch, this
    rank's experts, combine. ``buffer`` and the result: (n_experts, slots, d_model)."""

    def __init__(self, group):
        self.group = group

    def __call__(self, experts, buffer: torch.Tensor) -> torch.Tensor:
        n = dist.get_world_size(self.group)
        n_experts, slots, d_model = buffer.shape
        here = n_experts // n
        received = AllToAll.apply(buffer, self.group)  # (n sources x here, slots, d_model)
        mine = received.view(n, here, slots, d_model).transpose(0, 1).reshape(
            here, n * slots, d_model)  # each of my experts: every rank's tokens for it
        out = experts(mine).view(here, n, slots, d_model).transpose(0, 1)
        return AllToAll.apply(out.reshape(n_experts, slots, d_model), self.group)
