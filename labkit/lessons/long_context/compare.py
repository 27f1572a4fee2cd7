"""The MoE GPT beside the dense one, and the tokens dropped at each capacity factor: what
notebook 08 measures (every figure from runs on the ranks, FLOPs counted by PyTorch)."""

from __future__ import annotations

import torch

from labkit.models import build_model, count_parameters


def forward_flops_per_token(model_config) -> float:
    """FLOPs of one forward pass per token, counted by ``FlopCounterMode`` (the MoE's expert
    buffer counted whole: capacity slots, filled or not).

    Attention runs on SDPA's math backend here: ``FlopCounterMode`` counts none of the CPU
    fused kernel's FLOPs (torch 2.13), while the math backend's two matmuls (q k^T and
    p v, the whole seq x seq, masked half included) it counts."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.utils.flop_counter import FlopCounterMode

    model = build_model(model_config)
    tokens = torch.zeros(1, model_config.seq_len, dtype=torch.long)
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter, \
            torch.no_grad():
        model(tokens)
    return counter.get_total_flops() / model_config.seq_len


def counted(model_config) -> dict:
    """Parameters and forward FLOPs per token of a model, counted without training it."""
    return {"params": count_parameters(model_config),
            "flops_per_token": forward_flops_per_token(model_config)}


def moe_vs_dense(moe_report, dense_report) -> dict:
    """Parameters, forward FLOPs per token, final loss and median step of each run."""
    out = {}
    for name, report in (("dense", dense_report), ("moe", moe_report)):
        out[name] = counted(report.config.model) | {"final_loss": report.losses[-1],
                                                    "median_step_s": report.split()["step_s"]}
    return out


def capacity_sweep(cluster, config, factors, layout) -> dict[float, float]:
    """{capacity factor: share of the router's choices dropped over capacity}, each trained
    for real with ``config`` (a TrainConfig of the MoE GPT) under ``layout``."""
    from labkit.lessons.long_context.capacity import run_capacity

    return {float(f): run_capacity(cluster, config, layout, f).dropped_share for f in factors}
