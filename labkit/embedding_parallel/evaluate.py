"""Held-out AUC of a recommender: on the ranks during training, or from weights on the host.

The held-out batch comes from the same hidden teacher as the training data (same seed) but a
step number training never reaches, so the model has not seen its samples.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labkit.memory.capacity import on_host
from labkit.models import build_model, make_batch, to_device
from labkit.train.metrics import auc
from labkit.train.strategy import local_slice

HELD_OUT_STEP = 10**9  # the data of "step 10^9": never a training step
EVAL_SAMPLES = 2048


def held_out_batch(model_config, samples: int = EVAL_SAMPLES, seed: int = 0):
    """((dense, sparse), clicks) of ``samples`` held-out samples, on the host."""
    return make_batch(model_config, HELD_OUT_STEP, samples, seed)


def evaluate_on_ranks(ctx, model: nn.Module, config, samples: int = EVAL_SAMPLES) -> float:
    """Held-out AUC of the sharded ``model``, evaluated by all ranks together: each scores
    its slice of the batch (the lookups and exchanges are those of training), then the scores
    are all-gathered. Runs outside the memory tracker and the step's timings: evaluation is
    not part of the training step being measured."""
    samples -= samples % ctx.world_size
    with on_host(), torch.no_grad():
        inputs, clicks = held_out_batch(config.model, samples, config.seed)
        local = to_device(local_slice(inputs, ctx.rank, ctx.world_size), ctx.device)
        scores = model(local).float().contiguous()  # (samples / world_size,) logits
        if ctx.world_size > 1:
            gathered = scores.new_empty(samples)
            dist.all_gather_single(gathered, scores)
            scores = gathered
        return auc(scores.cpu(), clicks)


def held_out_auc(model_config, weights: dict | None = None, seed: int = 0,
                 samples: int = EVAL_SAMPLES) -> float:
    """Held-out AUC of the plain DLRM with ``weights`` (a state dict; None: the untrained
    model of ``seed``), computed in this process. Works for any strategy's returned weights
    (``merged_weights`` joins a sharded run's)."""
    model = build_model(model_config, "cpu", seed)
    if weights is not None:
        model.load_state_dict(weights)
    inputs, clicks = held_out_batch(model_config, samples, seed)
    with torch.no_grad():
        return auc(model(inputs), clicks)
