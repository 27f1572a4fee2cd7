"""The model zoo: an MLP, a GPT-style decoder (GPT-2 or Llama blocks) and a DLRM-style
recommender, each from a small typed config, each with deterministic synthetic data from a
hidden teacher (nothing downloads); published decoder shapes in ``presets``."""

from labkit.models.dlrm import DLRM, DLRMConfig
from labkit.models.gpt import GPT, GPTConfig
from labkit.models.mlp import MLP, MLPConfig
from labkit.models.moe import MoEGPT, MoEGPTConfig
from labkit.models.presets import (
    GPT3_175B,
    LLAMA3_8B,
    LLAMA3_70B,
    LLAMA3_405B,
    PUBLISHED_SHAPES,
)
from labkit.models.split import ParallelPlan
from labkit.models.zoo import (
    BIG_DECODERS,
    GPT_7B,
    GPT_70B,
    ModelConfig,
    build_model,
    config_for,
    count_parameters,
    example_batch,
    local_slice,
    loss_fn,
    make_batch,
    plan_for,
    sized,
    to_device,
)

__all__ = ["BIG_DECODERS", "DLRM", "GPT", "GPT3_175B", "GPT_7B", "GPT_70B", "LLAMA3_8B",
           "LLAMA3_70B", "LLAMA3_405B", "MLP", "PUBLISHED_SHAPES", "DLRMConfig", "GPTConfig",
           "MLPConfig", "ModelConfig", "MoEGPT", "MoEGPTConfig", "ParallelPlan", "build_model",
           "config_for",
           "count_parameters", "example_batch", "local_slice", "loss_fn", "make_batch",
           "plan_for", "sized", "to_device"]
