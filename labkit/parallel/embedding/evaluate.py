"""Held-out AUC of a recommender: on the ranks during training, or from weights on the host.

The held-out batch comes from the same hidden teacher as the training data (same seed) but a
step number training never reaches, so the model has not seen its samples.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labkit.models import build_model, local_slice, make_batch, to_device
from labkit.models.metrics import auc
from labkit.runtime.memory.capacity import on_host

HELD_OUT_STEP = 10**9  # the data of "step 10^9": never a training step
EVAL_SAMPLES = 2048


def held_out_batch(model_config, samples: int = EVAL_SAMPLES, seed: int = 0):
    """((dense, sparse), clicks) of ``samples`` held-out samples, on the host."""
    return make_batch(model_config, HELD_OUT_STEP, samples, seed)


def evaluate_on_ranks(run, model: nn.Module, config, samples: int = EVAL_SAMPLES) -> float:
    """Held-out AUC of the sharded ``model``, evaluated by all ranks together: each scores
    its data slice of the batch (the lookups and exchanges are those of training), then the
    scores are all-gathered (data slices are in rank order: a DLRM layout has no tp or pp).
    Runs outside the memory tracker and the step's timings: evaluation is not part of the
    training step being measured. ``run`` is the rank's ``ParallelContext``."""
    slices = run.layout.data_size
    samples -= samples % slices
    with on_host(), torch.no_grad():
        inputs, clicks = held_out_batch(config.model, samples, config.seed)
        local = to_device(local_slice(inputs, run.data_rank, slices), run.device)
        scores = model(local).float().contiguous()  # (samples / slices,) logits
        if slices > 1:
            gathered = scores.new_empty(samples)
            dist.all_gather_single(gathered, scores, group=dist.group.WORLD)
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
