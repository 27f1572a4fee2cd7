"""Tensor parallelism: the hand-written layers and DTensor's equal the plain layers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from labkit.tensor_parallel import parallel_mlp, tensor_parallel_mlp


def _local(tensor):
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def _compare_with_plain(ctx, kind: str) -> dict:
    torch.manual_seed(0)  # the same weights and input on every rank
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    x = torch.randn(4, 8)
    plain, x_plain = copy.deepcopy(mlp), x.clone().requires_grad_()
    plain(x_plain).pow(2).sum().backward()
    if kind == "scratch":
        tp = parallel_mlp(copy.deepcopy(mlp), ctx.rank, ctx.world_size)
    else:
        tp = tensor_parallel_mlp(copy.deepcopy(mlp), "cpu", ctx.world_size)
    x_tp = x.clone().requires_grad_()
    y = tp(x_tp)
    y.pow(2).sum().backward()
    n, r = ctx.world_size, ctx.rank
    expected = {  # this rank's shard of every plain gradient
        "0.weight": plain[0].weight.grad.chunk(n, 0)[r], "0.bias": plain[0].bias.grad.chunk(n)[r],
        "2.weight": plain[2].weight.grad.chunk(n, 1)[r], "2.bias": plain[2].bias.grad}
    grads = {name: _local(p.grad) for name, p in tp.named_parameters()}
    return {"output": (y - plain(x)).abs().max().item(),
            "input_grad": (x_tp.grad - x_plain.grad).abs().max().item(),
            "weight_grads": max((grads[k] - v).abs().max().item() for k, v in expected.items()),
            "local_params": sum(_local(p).numel() for p in tp.parameters()),
            "plain_params": sum(p.numel() for p in mlp.parameters())}


@pytest.mark.parametrize("kind", ["scratch", "dtensor"])
def test_tensor_parallel_mlp_equals_the_plain_layers(two, kind):
    for result in two.run(_compare_with_plain, kind):
        assert result["output"] < 1e-6
        assert result["input_grad"] < 1e-6
        assert result["weight_grads"] < 1e-6
        # Weights split in two; only the row layer's bias (8 values) is kept whole.
        assert result["local_params"] == (result["plain_params"] - 8) // 2 + 8
