"""Memory-bound traffic: the bytes a step's bandwidth-bound ops move on one rank (embedding
lookups, norms, elementwise ops, attention's math path or fused kernel, dropout, the
optimizer's passes), charged at the memory bandwidth by ``project``."""

from __future__ import annotations

import math

from labkit.plan.counts import is_decoder, is_recommender, optimizer_counts, sample_counts
from labkit.plan.frameworks import framework
from labkit.plan.levers import Lever, compute_bytes
from labkit.plan.parallelism import Parallelism


def memory_bound_bytes(model_config, layout: Parallelism, lever: Lever,
                       parameter_bytes: float, gradient_bytes: float = 0.0) -> float:
    """Bytes the step's bandwidth-bound ops move on one rank: embedding lookups, the other
    non-matmul ops (counted in fp32: a bf16 step moves about half), attention's, and the
    optimizer's passes over its state (counted on its ops).

    Attention: the math path writes and reads the seq x seq scores (counted on meta); a fused
    kernel (FlashAttention) reads q, k, v and writes its output forward, and reads q, k, v,
    the output and its gradient and writes three gradients backward (Dao et al. 2022): q, the
    output and their gradients 6 times (seq, d_model) per layer, k and v and theirs 6 times
    (seq, kv_heads x d_head): 12 times (seq, d_model) under multi-head attention.
    Recomputation repeats the forward's share: a third of a step's traffic (backward costs
    about twice forward: Kaplan et al. 2020), the whole
    blocks' under full checkpointing, the scores' under selective recomputation.

    fp16 with dynamic loss scaling (Micikevicius et al. 2018; torch's GradScaler, Megatron's
    DynamicGradScaler) unscales every gradient once a step and checks it for inf/NaN, one
    fused pass that reads and writes ``gradient_bytes``."""
    counts = sample_counts(model_config)
    samples_here = lever.global_batch / layout.data_size
    width = compute_bytes(lever.precision) / 4
    if lever.flash_attention and is_decoder(model_config):
        kv_width = model_config.kv_heads * model_config.d_head
        attention = (6.0 * 4 * model_config.n_layers * model_config.seq_len
                     * (model_config.d_model + kv_width))
    else:
        attention = counts.attention_bytes + dropout_bytes(model_config, lever)
    other = counts.other_bytes + attention
    if width < 1 and counts.logits_bytes:
        # the loss runs in fp32 whatever the compute dtype: Megatron's cross entropy casts
        # the logits (.float(): tensor_parallel/cross_entropy.py), torchtitan's loss_fn
        # too (train.py, 2024-12), autocast runs log_softmax and nll_loss in fp32 (torch's
        # autocast op list): its ops' bytes as counted (fp32), and the casts, the logits
        # read in bf16 and written in fp32 forward, their gradient back (12 bytes a logit)
        casts = 12 * model_config.seq_len * model_config.vocab_size
        other += (counts.logits_bytes + casts) / width - counts.logits_bytes
    if lever.activation_checkpointing:
        other += (counts.other_bytes + attention) / 3
    elif lever.selective_recompute == "op":  # every op but the matmuls and attention again
        other += counts.other_bytes / 3
    elif lever.selective_recompute and not lever.flash_attention:
        other += attention / 3
    per_rank = ((counts.lookup_bytes + other * width) * samples_here / (layout.tp * layout.pp)
                + counts.table_bytes * table_share(model_config, layout, lever))
    unscale = 2 * gradient_bytes if lever.precision == "fp16" else 0.0
    return per_rank + optimizer_counts(lever.optimizer)[0] * parameter_bytes + unscale


def table_share(model_config, layout: Parallelism, lever: Lever) -> float:
    """The share of the embedding tables' dense gradient one rank writes in a step: a DLRM's
    tables placed over fsdp (whole tables: the fullest rank's ceil(tables / fsdp); rows split:
    1 / fsdp; as ``recommender.recommender_memory`` places them), a decoder's table split by
    rows over tp where the framework shards the vocabulary (Megatron's
    ``VocabParallelEmbedding``, torchtitan's TP plan); else the whole table."""
    if is_recommender(model_config) and layout.tables is not None:
        if layout.tables == "table_wise":
            tables = model_config.num_tables
            return math.ceil(tables / layout.fsdp) / tables
        return 1.0 / layout.fsdp
    if is_decoder(model_config) and framework(lever.framework).vocab_parallel:
        return 1.0 / layout.tp
    return 1.0


def dropout_bytes(model_config, lever: Lever) -> float:
    """Bytes attention dropout moves per sample on the math path, counted in fp32 like the
    rest (``memory_bound_bytes`` scales them to the compute dtype): forward reads the
    probabilities and writes them and a one-byte mask, backward reads the gradient and the mask
    and writes the gradient (heads x seq x seq values each time, every layer)."""
    if not (is_decoder(model_config) and framework(lever.framework).attention_dropout):
        return 0.0
    scores = model_config.n_layers * model_config.n_heads * model_config.seq_len ** 2
    width = compute_bytes(lever.precision)
    per_value = (2 * width + 1 + width + 1 + width) * 4 / width  # in fp32-counted bytes
    return scores * per_value
