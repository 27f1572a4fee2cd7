"""The zoo: configs, sizing by parameter count, deterministic data that can be learned."""

from __future__ import annotations

import pytest
import torch

from labkit.models import (
    DLRMConfig,
    GPTConfig,
    MLPConfig,
    build_model,
    config_for,
    count_parameters,
    loss_fn,
    make_batch,
    sized,
)

ZOO = [MLPConfig(), GPTConfig(), DLRMConfig()]


@pytest.mark.parametrize("name", ["mlp", "gpt", "dlrm"])
@pytest.mark.parametrize("params", [3e5, 3e6])
def test_sized_models_have_about_the_asked_parameter_count(name, params):
    count = count_parameters(sized(name, int(params)))
    assert 0.8 * params < count < 1.25 * params


@pytest.mark.parametrize("config", ZOO, ids=lambda c: c.name)
def test_same_seed_same_weights_and_data(config):
    a, b = build_model(config, seed=3), build_model(config, seed=3)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    x1, y1 = make_batch(config, step=5, batch_size=4)
    x2, y2 = make_batch(config, step=5, batch_size=4)
    assert torch.equal(y1, y2)
    assert not torch.equal(make_batch(config, step=6, batch_size=4)[1], y1)


@pytest.mark.parametrize("config, lr, batch", [(MLPConfig(), 1e-2, 64), (GPTConfig(), 3e-3, 8),
                                               (DLRMConfig(), 1e-2, 64)],
                         ids=["mlp", "gpt", "dlrm"])
def test_hidden_teacher_data_is_learnable(config, lr, batch):  # 8 sequences: 1,024 tokens
    model = build_model(config)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for step in range(40):
        inputs, targets = make_batch(config, step, batch)
        loss = loss_fn(config)(model(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.9 * sum(losses[:5]) / 5


def test_unknown_model_and_bad_heads_are_clear_errors():
    with pytest.raises(ValueError, match="unknown model"):
        config_for("resnet")
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(d_model=100, n_heads=3)
