"""The model zoo: build any model from its config, make its data, size it by parameter count."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
from torch import nn

from labkit.models.dlrm import DLRM, DLRMConfig, dlrm_batch
from labkit.models.dlrm_split import DLRMPlan
from labkit.models.gpt import GPT, GPTConfig, gpt_batch
from labkit.models.gpt_split import GPTPlan
from labkit.models.mlp import MLP, MLPConfig, mlp_batch
from labkit.models.mlp_split import MLPPlan
from labkit.models.moe import MoEGPT, MoEGPTConfig
from labkit.models.moe_split import MoEPlan
from labkit.models.split import ParallelPlan

ModelConfig = MLPConfig | GPTConfig | DLRMConfig | MoEGPTConfig

# config type -> (model class, data maker, parallel plan)
_ZOO = {MLPConfig: (MLP, mlp_batch, MLPPlan()), GPTConfig: (GPT, gpt_batch, GPTPlan()),
        DLRMConfig: (DLRM, dlrm_batch, DLRMPlan())}
_ZOO[MoEGPTConfig] = (MoEGPT, gpt_batch, MoEPlan())  # a GPT's data, its MLPs as experts
_CONFIGS = {"mlp": MLPConfig, "gpt": GPTConfig, "dlrm": DLRMConfig}
_CONFIGS["moe_gpt"] = MoEGPTConfig
# The width each family scales when sized by parameter count, and how it must be rounded.
_WIDTH = {"mlp": ("d_hidden", 8), "gpt": ("d_model", 32), "dlrm": ("rows_per_table", 1),
          "moe_gpt": ("d_model", 32)}

# Real-world decoders for the estimator (never built for real): GPT-style blocks, 4x MLP.
GPT_7B = GPTConfig(vocab_size=32_000, seq_len=2048, d_model=4096, n_heads=32, n_layers=32)
GPT_70B = GPTConfig(vocab_size=32_000, seq_len=2048, d_model=8192, n_heads=64, n_layers=80)
BIG_DECODERS = {"7B": GPT_7B, "70B": GPT_70B}


def config_for(name: str, **fields) -> ModelConfig:
    """The default config of zoo model ``name`` ("mlp", "gpt", "dlrm"), with fields replaced."""
    if name not in _CONFIGS:
        raise ValueError(f"unknown model {name!r}: choose one of {', '.join(_CONFIGS)}")
    return _CONFIGS[name](**fields)


def build_model(config: ModelConfig, device: Any = "cpu", seed: int = 0,
                dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model for ``config``; the same ``seed`` gives the same weights on every rank.

    Weights are created directly in ``dtype`` on ``device`` (no float32 copy on the way),
    drawn from the CPU generator: training builds on "cpu" (values) and "meta" (shapes) only,
    so one seed gives the same weights whatever the layout or device.
    """
    model_class = _ZOO[type(config)][0]
    default_dtype = torch.get_default_dtype()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        torch.set_default_dtype(dtype)
        try:
            with torch.device(device):
                return model_class(config)
        finally:
            torch.set_default_dtype(default_dtype)


def plan_for(config: ModelConfig) -> ParallelPlan:
    """How ``config``'s model is split by each parallelism (``labkit/models/*_split.py``)."""
    return _ZOO[type(config)][2]


def make_batch(config: ModelConfig, step: int, batch_size: int, seed: int = 0):
    """The global batch for ``step``: (inputs, targets), deterministic, on the CPU."""
    return _ZOO[type(config)][1](config, step, batch_size, seed)


def local_slice(value, index: int, parts: int):
    """Slice ``index`` of ``parts`` equal slices of a batch (a tensor or a tuple of tensors):
    what data-parallel rank ``index`` trains on."""
    if isinstance(value, tuple):
        return tuple(local_slice(v, index, parts) for v in value)
    share = value.shape[0] // parts
    return value[index * share:(index + 1) * share]


def loss_fn(config: ModelConfig):
    return _ZOO[type(config)][0].loss


def to_device(value, device, copy: bool = False):
    """Move a tensor or a tuple of tensors (DLRM's inputs) to ``device``.

    ``copy=True`` always makes a new tensor, as a host-to-GPU copy does, also on the CPU.
    """
    if isinstance(value, tuple):
        return tuple(to_device(v, device, copy) for v in value)
    return value.to(device, copy=copy)


def count_parameters(config: ModelConfig) -> int:
    """Parameter count, from a model built on the meta device (nothing is allocated)."""
    return sum(p.numel() for p in build_model(config, device="meta").parameters())


def sized(name: str, params: int, **fields) -> ModelConfig:
    """A config of family ``name`` with about ``params`` parameters (its width is solved for)."""
    base = config_for(name, **fields)
    width_field, multiple = _WIDTH[name]

    def with_width(width: int) -> ModelConfig:
        return dataclasses.replace(base, **{width_field: max(multiple, width)})

    low, high = multiple, multiple
    while count_parameters(with_width(high)) < params:
        low, high = high, high * 2
    while high - low > multiple:  # bisect on the width, in steps of ``multiple``
        mid = (low + high) // 2 // multiple * multiple
        low, high = (mid, high) if count_parameters(with_width(mid)) < params else (low, mid)
    best = min((low, high), key=lambda w: abs(math.log(count_parameters(with_width(w)) / params)))
    return with_width(best)


def example_batch(config: ModelConfig, batch_size: int, device: Any = "cpu"):
    """A batch of the right shapes and dtypes, all zeros: for tracing (e.g. on fake tensors)."""
    with torch.device(device):
        if isinstance(config, MLPConfig):
            return torch.zeros(batch_size, config.d_in), torch.zeros(batch_size, config.d_out)
        if isinstance(config, GPTConfig):
            shape = (batch_size, config.seq_len)
            return (torch.zeros(shape, dtype=torch.long), torch.zeros(shape, dtype=torch.long))
        dense = torch.zeros(batch_size, config.dense_features)
        sparse = torch.zeros(batch_size, config.num_tables, dtype=torch.long)
        return (dense, sparse), torch.zeros(batch_size)
