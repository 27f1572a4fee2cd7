"""What one training step costs one rank of a layout: FLOPs, memory-bound bytes, memory by
category, and the bytes of every collective per mesh dimension.

The counts come from ``counts.py`` (one sample, one block, counted on meta tensors); this file
scales them by the layout, each rule in one place:

* FLOPs per rank: the model's per-sample FLOPs x samples in the step / ranks (data
  parallelism splits samples, tensor parallelism each matmul, a pipeline the layers), plus the
  blocks' forward again under activation checkpointing.
* Memory per rank: ``memory_model.py``; memory-bound traffic: ``traffic.py``.
* Collectives (bytes of the tensor each works on; ``labkit.costs.ring_share`` gives what a rank
  sends): tp: one AllReduce per column/row pair forward and one backward, of a micro-batch's
  activations (and, where checkpointed inputs are distributed over tp, an all-gather of each
  block's input before its recomputation); dp: an AllReduce of the gradients (DDP, once per
  step); fsdp: an all-gather of the parameters in forward and again in backward per
  micro-batch (in forward only where the framework keeps them gathered to backward, and then
  once a step in a pipeline), a reduce-scatter of the gradients (once a step, or after every
  micro-batch where the framework reduces so); pp: a send of the activations forward and of
  their gradient backward per micro-batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.models import build_model, plan_for
from labkit.plan.counts import block_counts, is_decoder, sample_counts
from labkit.plan.cp_ep import cp_ep_comm
from labkit.plan.frameworks import framework
from labkit.plan.levers import Lever, StepCosts, compute_bytes
from labkit.plan.memory_model import _zero_stage, decoder_memory, local_params
from labkit.plan.parallelism import Parallelism

DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket (torch.distributed's default: 1 MiB)


@functools.lru_cache(maxsize=64)
def _tp_widths(model_config) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(each column layer's input width, each row layer's output width), once per model: an
    AllReduce of a micro-batch's activations of that width runs in backward at every column
    layer's input (SwiGLU's gate and up: one each) and in forward at every row layer's
    output."""
    if is_decoder(model_config) and model_config.n_layers > 1:  # identical blocks
        cols, rows = _tp_widths(replace_layers(model_config, 1))
        return cols * model_config.n_layers, rows * model_config.n_layers
    model = build_model(model_config, device="meta")
    modules = dict(model.named_modules())
    styles = plan_for(model_config).tp_styles(model)
    cols = [modules[n].in_features for n, s in styles.items() if isinstance(s, ColwiseParallel)]
    rows = [modules[n].out_features for n, s in styles.items() if isinstance(s, RowwiseParallel)]
    return tuple(cols), tuple(rows)


def _tokens_per_sample(model_config) -> int:
    return getattr(model_config, "seq_len", 1)


def attention_flops(model_config) -> float:
    """Forward FLOPs of one sample's attention scores and weighted sum (Q K^T and P V,
    2 s^2 d each per layer): what the meta count's math path charges forward (backward twice
    that); 0 for a model without attention."""
    if not is_decoder(model_config):
        return 0.0
    return 4.0 * model_config.n_layers * model_config.seq_len ** 2 * model_config.d_model


def step_flops(model_config, layout: Parallelism, lever: Lever) -> tuple[float, float]:
    """(FLOPs of this rank, model FLOPs of the step over all ranks).

    Recomputation: full checkpointing reruns the blocks' forward; selective reruns the
    attention core (Korthikanti et al. 2022). A fused causal attention kernel (FlashAttention)
    skips the blocks above the diagonal (half the scores; Dao 2023, FlashAttention-2, section
    3.1.1) and its backward runs 5 of the matmuls where the forward runs 2 (it recomputes the
    scores: Algorithm 2), so it does 3.5 x 0.5 of the forward's attention FLOPs where the math
    path's forward and backward do 3, and selective recomputation adds nothing to it.

    A pipeline runs at its slowest stage's pace: a decoder's busiest stage holds
    ceil(layers / pp) blocks and the head (the embedding's lookup costs no FLOPs)."""
    counts = sample_counts(model_config)
    model = counts.flops * lever.global_batch
    attn = attention_flops(model_config)
    per_sample = counts.flops
    if lever.activation_checkpointing:
        per_sample += counts.block_forward_flops
    elif lever.selective_recompute == "op":  # every second of the blocks' matmuls again
        per_sample += 0.5 * (counts.block_forward_flops - attn)
    elif lever.selective_recompute and not lever.flash_attention:
        per_sample += attn
    if lever.flash_attention and attn:
        again = attn if lever.activation_checkpointing else 0.0
        per_sample += (3.5 * attn + again) * 0.5 - (3 * attn + again)
    share = 1 / layout.pp
    if layout.pp > 1 and is_decoder(model_config):
        # the blocks' forward and backward: 3 x their forward (backward is twice forward)
        blocks = 3 * counts.block_forward_flops
        head = max(counts.flops - blocks, 0.0)
        per_block = (per_sample - head) / model_config.n_layers
        busiest = math.ceil(model_config.n_layers / layout.pp) * per_block + head
        share = busiest / per_sample
    return per_sample * lever.global_batch * share / (layout.size / layout.pp), model


def fused_attention_flops(model_config, layout: Parallelism, lever: Lever) -> float:
    """FLOPs this rank's fused attention kernel (FlashAttention) does in a step: its forward
    (half the scores under the causal mask) and its backward (3.5 x 0.5 of the forward's
    attention FLOPs in all, ``step_flops``), again under full checkpointing; the busiest
    pipeline stage's blocks. 0 on the math path (its matmuls are ordinary bmm's). ``project``
    times them at the kernel's own rate (``hardware.GPU.flash_attention_efficiency``)."""
    attn = attention_flops(model_config)
    if not (lever.flash_attention and attn):
        return 0.0
    again = attn if lever.activation_checkpointing else 0.0
    per_sample = (3.5 * attn + again) * 0.5
    layers = model_config.n_layers
    stage = math.ceil(layers / layout.pp) / layers  # the busiest stage's share of the blocks
    return per_sample * lever.global_batch * stage / (layout.size / layout.pp)


def step_comm(model_config, layout: Parallelism, lever: Lever, local_params: float,
              measured: bool = False) -> dict[tuple[str, str], tuple[int, float]]:
    """{(dim, collective): (calls, tensor bytes)} one rank issues in one step."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    m = lever.micro_batches
    micro = lever.global_batch // layout.data_size // m
    tokens = micro * _tokens_per_sample(model_config) // layout.cp  # cp: a rank's chunks
    if layout.tp > 1:
        out[("tp", "all_reduce")] = _tp_comm(model_config, layout, lever, tokens)
        if (lever.activation_checkpointing and is_decoder(model_config)
                and not lever.sequence_parallel
                and framework(lever.framework).distribute_checkpoints):
            # each block's checkpointed input, kept 1/tp a rank, gathered to recompute it
            blocks = math.ceil(model_config.n_layers / layout.pp) * m
            out[("tp", "all_gather")] = (blocks, blocks * tokens * model_config.d_model
                                         * compute_bytes(lever.precision))
    if layout.pp > 1:
        out[("pp", "send")] = _pp_comm(model_config, layout, lever, tokens)
    grad_bytes = framework(lever.framework).gradient_bytes(lever.precision)
    grads = local_params * grad_bytes
    if layout.cp > 1 or layout.ep > 1:
        sharded = 1 / layout.fsdp if layout.data_engine == "fsdp" else 1.0
        out.update(cp_ep_comm(model_config, layout, micro, m, grad_bytes, sharded,
                              local_params if layout.tp > 1 else None))
        if layout.ep > 1:  # replicas averaged by hand (in cp_ep_comm), not by DDP
            return out
    engine = layout.data_engine
    if engine == "tables":
        from labkit.plan.recommender import table_comm

        out.update(table_comm(model_config, layout, lever))
        return out
    if engine == "fsdp":
        units = _units(model_config, layout)
        runner = framework(lever.framework)
        # reduced once a step (no_sync over the micro-batches), or after every micro-batch
        reductions = m if runner.reduce_every_micro_batch else 1
        if layout.fsdp > 1:
            out[("fsdp", "all_gather")] = fsdp_gathers(model_config, layout, lever,
                                                       local_params)
            out[("fsdp", "reduce_scatter")] = (units * reductions, grads * reductions)
        if layout.dp > 1:
            out[("dp", "all_reduce")] = (units, grads / layout.fsdp)
    elif engine in ("ddp", "zero1", "naive") and layout.dp > 1:
        buckets = gradient_buckets(grads, local_params, layout.dp, lever.framework)
        if lever.zero_stage and framework(lever.framework).param_gather:
            # the distributed optimizer: gradients reduce-scattered, parameters gathered
            out[("dp", "reduce_scatter")] = (buckets, grads)
            out[("dp", "all_gather")] = (buckets, local_params * compute_bytes(lever.precision))
            return out
        out[("dp", "all_reduce")] = (buckets, grads)
        if engine == "zero1":
            out[("dp", "broadcast")] = (1, local_params * 4)
    return out


def fsdp_gathers(model_config, layout: Parallelism, lever: Lever,
                 local_params: float) -> tuple[int, float]:
    """(calls, bytes) of FSDP's all-gathers in a step on one rank.

    FSDP2 gathers each block in forward and again in backward per micro-batch, the root
    (embeddings, head) once, which stays gathered from its forward to its backward; a
    framework that keeps the blocks gathered to backward (``Framework.reshards_after_forward``
    False) gathers each unit once per micro-batch. In a pipeline, torch.distributed.pipelining
    does not reshard a stage's FSDP modules after a micro-batch's backward (they wait, gathered,
    for the reduction after the last: ``PipelineStage.backward_maybe_with_nosync``,
    ``perform_reduce_grad``): a forward that follows a backward finds its units gathered
    (and reshards them after it), a backward that follows a backward too. Then a block is
    gathered once a step where it is kept to backward, and otherwise m + 1 times, under any
    schedule: every forward reshards it (``FSDPParamGroup.post_forward``), so the op after
    each forward gathers it again, and the step's first op gathers it once; the root once a
    step. Not modelled: interleaving with more than 3 chunks a rank, where torch's runtime
    frees idle stages (``max_active_stages`` 3) and gathers them again; it is counted as if
    every chunk stayed gathered."""
    m = lever.micro_batches
    units = _units(model_config, layout)
    blocks = _block_share(model_config, layout, local_params)
    root = local_params - blocks
    keep = not framework(lever.framework).reshards_after_forward(layout.pp > 1)
    if layout.pp > 1:
        rounds = 1 if keep else m + 1
        calls, nbytes = (units - 1) * rounds + 1, blocks * rounds + root
    elif keep:
        calls, nbytes = units * m, local_params * m
    else:
        calls, nbytes = (2 * units - 1) * m, (local_params + blocks) * m
    return calls, nbytes * compute_bytes(lever.precision)


def _tp_comm(model_config, layout: Parallelism, lever: Lever, tokens: int) -> tuple[int, float]:
    """(calls, bytes) of tp's AllReduces in a step: one per column/row pair forward and one
    backward per micro-batch, of ``tokens`` (a micro-batch's) activations."""
    m = lever.micro_batches
    act = compute_bytes(lever.precision)  # activations travel in the compute dtype
    cols, rows = _tp_widths(model_config)
    share = 1 / layout.pp  # a stage's share of the layers
    calls = (len(cols) + len(rows)) * m * share
    width = sum(cols) + sum(rows)
    if lever.activation_checkpointing and is_decoder(model_config):
        # backward reruns each block's forward, and with it the row layers' forward
        # AllReduce, but torch.utils.checkpoint stops early (non-reentrant: once the last
        # tensor backward needs is recomputed): the block's last row layer's output is
        # not, so a block of k row layers recomputes k-1 AllReduces (measured: tests/test_plan);
        # a reentrant checkpoint (Megatron's, metaseq's) reruns the whole forward: all k
        rows_of_one = _tp_widths(replace_layers(model_config, 1))[1]
        if not framework(lever.framework).reentrant_checkpoint:
            rows_of_one = rows_of_one[:-1]
        again = list(rows_of_one) * model_config.n_layers
        calls += len(again) * m * share
        width += sum(again)
    return round(calls), width * tokens * act * m * share


def _pp_comm(model_config, layout: Parallelism, lever: Lever, tokens: int) -> tuple[int, float]:
    """(sends, bytes) of a pipeline rank's p2p in a step: activations forward, their
    gradients backward, ``tokens`` (a micro-batch's) wide rows each."""
    m = lever.micro_batches
    act = compute_bytes(lever.precision)
    width = getattr(model_config, "d_model", 0) or model_config.d_hidden
    # a middle stage sends activations forward and gradients backward; an end stage one
    sends = m if layout.pp == 2 else 2 * m
    if lever.virtual_stages > 1:  # each chunk boundary is a send, there and back
        sends = 2 * m * lever.virtual_stages
    # Megatron's scatter/gather (or sequence parallelism): each tp rank sends 1/tp
    split = layout.tp if (framework(lever.framework).pp_scatter
                          or lever.sequence_parallel) else 1
    return sends, sends * tokens * width * act / split


def gradient_buckets(grad_bytes: float, params: float, dp: int,
                     framework_name: str = "labkit") -> int:
    """Collectives a step's gradient reduction issues, as the framework buckets it
    (``labkit.plan.frameworks``): torch DDP's via ``ddp_buckets``."""
    if framework_name == "labkit":
        return ddp_buckets(grad_bytes)
    bucket = framework(framework_name).bucket_bytes(params, dp, grad_bytes)
    return max(1, math.ceil(grad_bytes / bucket))


def ddp_buckets(grad_bytes: float) -> int:
    """AllReduces DDP issues per step for ``grad_bytes`` of gradients: a small first bucket
    (the last layers' gradients, ready first, sent early), then buckets of bucket_cap_mb."""
    rest = max(0.0, grad_bytes - DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(rest / DDP_BUCKET_BYTES)


def _block_share(model_config, layout: Parallelism, local: float) -> float:
    """Parameters of a rank's FSDP units other than the root (its blocks or linears)."""
    if is_decoder(model_config):
        return math.ceil(model_config.n_layers / layout.pp) * block_counts(
            model_config, layout.tp).params
    return local  # the MLP: every linear is a unit, the root holds none


def _units(model_config, layout: Parallelism) -> int:
    """FSDP units on a rank: each block (each linear of the MLP) and the root."""
    layers = getattr(model_config, "n_layers", 1)
    return math.ceil(layers / layout.pp) + 1


def replace_layers(model_config, n_layers: int):
    return dataclasses.replace(model_config, n_layers=n_layers)


__all__ = ["Lever", "StepCosts", "_zero_stage", "attention_flops", "compute_bytes",
           "decoder_memory", "ddp_buckets", "fused_attention_flops", "gradient_buckets",
           "local_params", "step_comm", "step_flops"]
