"""Tensor parallelism: the hand-written layers and DTensor's equal the plain layers."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import labkit
from labkit.models import GPTConfig, MLPConfig
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


@pytest.mark.parametrize("model", [MLPConfig(n_layers=4), MLPConfig(n_layers=3),
                                   GPTConfig(n_layers=2)], ids=["mlp", "mlp-odd", "gpt"])
def test_tensor_parallel_training_equals_one_device(one, two, model):
    config = labkit.TrainConfig(model=model, global_batch=16, steps=3, lr=0.05,
                                optimizer="sgd")
    reference = labkit.train(one, config, estimate=False)
    report = labkit.train(two, config, strategy="tp")
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
    full = reference.ranks[0]["memory"]["at_peak"]["parameters"]
    for rank in report.ranks:  # each rank holds about half the weights
        assert rank["memory"]["at_peak"]["parameters"] < 0.6 * full
    if model.name == "mlp" and model.n_layers == 4:
        assert max(report.peak_bytes) < 0.6 * reference.peak_bytes[0]


def test_tensor_parallel_on_four_ranks_splits_heads(one):
    config = labkit.TrainConfig(model=GPTConfig(n_layers=1), global_batch=8, steps=2,
                                lr=0.05, optimizer="sgd")
    reference = labkit.train(one, config, estimate=False)
    with labkit.Cluster(4, device="cpu", progress=False) as four:
        report = labkit.train(four, config, strategy="tp")
    assert report.losses == pytest.approx(reference.losses, rel=1e-5)
