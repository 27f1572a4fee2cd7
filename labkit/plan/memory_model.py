"""The memory model: peak bytes by category on the worst rank of a decoder layout (no trace),
and the parameters one rank holds.

* Model state: ``labkit.runtime.costs.model_state_bytes``, the one count of it, with the recipe the
  framework's mixed precision keeps (``frameworks.Framework.state_recipe``): ZeRO-3 over fsdp,
  ZeRO-1 over dp for "zero1", or the lever's ``zero_stage`` over the dp replicas beside tp and
  pp (Megatron's distributed optimizer, DeepSpeed's ZeRO-1/2).
* Activations: what autograd saves per block per sample (counted for one tp rank's block) x
  blocks on the stage x samples per micro-batch x micro-batches in flight (1; a 1F1B stage
  holds pp, GPipe all of them). Fused attention and selective recomputation keep no
  seq x seq scores; sequence parallelism splits the d_model-wide tensors over tp
  (Korthikanti et al. 2022); torchtitan's op policy keeps every second matmul's output.
* FSDP's two gathered blocks (all of a rank's, where the framework keeps them gathered from
  forward to backward, and in a pipeline, whose stages stay gathered to the step's end); and
  where the gradients are reduced once a step over several micro-batches, the unsharded
  gradients FSDP accumulates until then.
"""

from __future__ import annotations

import math

from labkit.plan.counts import block_counts, is_decoder, rest_saved_bytes, sample_counts
from labkit.plan.cp_ep import ep_local_params
from labkit.plan.frameworks import framework
from labkit.plan.levers import Lever, compute_bytes
from labkit.plan.parallelism import Parallelism
from labkit.runtime.costs import OPTIMIZER_STATE_COPIES, model_state_bytes


def _zero_stage(layout: Parallelism, lever: Lever | None = None) -> tuple[int, int]:
    """(ZeRO stage, ranks it shards over) of the layout's data-parallel engine, or of the
    lever's ``zero_stage`` over the dp replicas (beside tp and pp)."""
    engine = layout.data_engine
    if engine == "fsdp":
        return 3, layout.fsdp
    if engine == "zero1":
        return 1, layout.dp
    if lever is not None and lever.zero_stage and layout.dp > 1:
        return lever.zero_stage, layout.dp
    return 0, 1


def _state_precision(precision: str, framework_name: str = "labkit") -> str:
    """The ``model_state_bytes`` row (recipe) of the precision lever: "mixed" is the
    framework's mixed precision (labkit, torchtitan: "fp32-master", fp32 weights, gradients
    reduced in fp32 and moments, bf16 compute; Megatron: "megatron", bf16 weights, fp32 main
    gradients, fp32 master and moments). "fp16" keeps the same state as "mixed" (fp16
    weights where the recipe has bf16 ones: the same bytes); its loss scale is one scalar.
    The wire carries what memory holds (``step_comm``)."""
    if precision in ("mixed", "fp16"):
        return framework(framework_name).state_recipe
    return precision


def _optimizer_share(row: str, optimizer: str) -> float:
    """The part of ``model_state_bytes``'s Adam state that ``optimizer`` keeps: its moments
    (2 for Adam, 0 for SGD) per parameter, plus the fp32 master copy of a row that has one."""
    moment = 2 if row == "bf16" else 4
    master = 4 if row in ("mixed", "megatron") else 0
    adam = master + OPTIMIZER_STATE_COPIES["adam"] * moment
    return (master + OPTIMIZER_STATE_COPIES[optimizer] * moment) / adam


def _activation_blocks(model_config, layout: Parallelism, lever: Lever,
                       flash_attention: bool) -> tuple:
    """(block counts, bytes one block saves per sample, its input's bytes per sample) on a
    tp rank: the seq x seq scores left out under fused attention or selective
    recomputation, the d_model-wide tensors split over tp under sequence parallelism."""
    no_scores = flash_attention or bool(lever.selective_recompute)
    fused = flash_attention and framework(lever.framework).fused_saves  # GPU kernels
    blocks = block_counts(model_config, layout.tp, no_scores, fused)
    saved, inputs = blocks.saved_bytes, blocks.input_bytes
    if lever.selective_recompute == "op":
        saved = op_policy_saved_bytes(model_config, layout.tp)
    if lever.sequence_parallel and layout.tp > 1:
        saved -= blocks.full_width_bytes * (1 - 1 / layout.tp)
        inputs /= layout.tp
    elif framework(lever.framework).distribute_checkpoints and layout.tp > 1:
        inputs /= layout.tp  # each tp rank keeps its slice of a checkpointed input
    return blocks, saved, inputs


def op_policy_saved_bytes(model_config, tp: int) -> float:
    """Bytes per sample one block keeps under torchtitan's op-level selective checkpointing
    (torchtitan/distributed/activation_checkpoint.py: save the outputs of matmuls and of
    attention, except every second matmul; recompute the rest), counted in fp32 like
    ``block_counts``: the odd-numbered linears' outputs, attention's output and the block's
    input, on one tp rank."""
    from labkit.plan.counts import local_block_linears

    tokens = model_config.seq_len * 4  # bytes of one fp32 value per token
    widths = local_block_linears(model_config, tp)
    kept = sum(widths[0::2])
    return tokens * (kept + model_config.d_model // tp + model_config.d_model)


def decoder_memory(model_config, layout: Parallelism, lever: Lever, measured: bool = False,
                   flash_attention: bool = True) -> dict[str, float]:
    """Peak bytes by category on the worst rank of a decoder layout (no trace)."""
    blocks, saved, inputs = _activation_blocks(model_config, layout, lever, flash_attention)
    per_stage = math.ceil(model_config.n_layers / layout.pp)
    local = local_params(model_config, layout, lever.framework)
    stage, shards = _zero_stage(layout, lever)
    row = _state_precision(lever.precision, lever.framework)
    state = model_state_bytes(local, shards, stage, row)
    state["optimizer"] *= _optimizer_share(row, lever.optimizer)
    micro = lever.global_batch // layout.data_size // lever.micro_batches
    width = compute_bytes(lever.precision) / 4  # counted in fp32; bf16 saves half
    if lever.activation_checkpointing:  # block inputs kept, one block recomputed at a time
        in_blocks = per_stage * inputs
        recompute = saved
    else:
        in_blocks, recompute = per_stage * saved, 0.0
    rest = rest_saved_bytes(model_config)
    if framework(lever.framework).vocab_parallel:  # the logits split over the vocabulary
        rest /= layout.tp
    if layout.pp == 1:
        per_sample = (in_blocks + rest) * _in_flight(layout, lever) + recompute
    else:  # the first stage holds the most micro-batches, the last the head's logits
        first = in_blocks * _in_flight(layout, lever)
        last = in_blocks * (lever.micro_batches if layout.engines.schedule_order == "gpipe" else 1)
        per_sample = max(first, last + rest) + recompute
    activations = per_sample * width * micro / layout.cp  # cp: 2 of 2cp chunks a sequence
    other = 0.0
    runner = framework(lever.framework)
    pipelined = layout.pp > 1
    if stage == 3 and shards > 1 and (pipelined or not runner.reshards_after_forward(False)):
        # every unit gathered: kept to backward, or in a pipeline past it (torch's stages
        # reshard only after the last micro-batch: step.fsdp_gathers)
        other += local * compute_bytes(lever.precision)
    elif stage == 3 and shards > 1:  # FSDP2 gathers a block and prefetches the next
        other += 2 * blocks.params * compute_bytes(lever.precision)
    gradients = state["gradients"]
    if (stage == 3 and shards > 1 and not runner.reduce_every_micro_batch
            and (pipelined or lever.micro_batches > 1)):
        # reduced once a step: FSDP2 keeps the unsharded gradients, in the dtype they are
        # reduced in, until the last micro-batch (set_requires_gradient_sync(False):
        # FSDPParam.unsharded_accumulated_grad, in reduce_dtype); the sharded ones appear as
        # those are freed, never both in full
        gradients = max(gradients, local * runner.gradient_bytes(lever.precision))
    return {"parameters": state["parameters"], "gradients": gradients,
            "optimizer": state["optimizer"], "activations": activations, "other": other}


def _pipeline_ends(model_config, rest: float) -> float:
    """Parameters of the larger end of a pipeline: the first stage's embeddings, or the last
    stage's final norm (LayerNorm's weight and bias, RMSNorm's weight) and head. Tied
    embeddings keep a copy of the token embedding as the last stage's head (Megatron-LM
    shares it so, its gradients all-reduced between the two stages)."""
    d = model_config.d_model
    norm = (2 if model_config.norm == "layernorm" and model_config.bias else 1) * d
    head = model_config.vocab_size * d
    first = rest - norm - (0 if model_config.tie_embeddings else head)
    return max(first, norm + head)


def _in_flight(layout: Parallelism, lever: Lever) -> int:
    """Micro-batches whose activations a stage holds at once (the first stage's)."""
    schedule = layout.engines.schedule_order  # the hand-written ones as torch's
    if schedule is None:
        return 1
    if schedule == "gpipe":
        return lever.micro_batches
    return min(layout.pp, lever.micro_batches)


def local_params(model_config, layout: Parallelism, framework_name: str = "labkit") -> float:
    """Parameters one rank holds before any ZeRO sharding (split by tp and pp; the embedding
    and head split over tp too where the framework's are vocab-parallel)."""
    counts = sample_counts(model_config)
    if is_decoder(model_config):
        blocks = block_counts(model_config, layout.tp)
        rest = counts.params - model_config.n_layers * blocks.full_params
        per_stage = math.ceil(model_config.n_layers / layout.pp)
        # the worst stage holds the larger end (embeddings or norm + head) beside its blocks
        ends = rest if layout.pp == 1 else _pipeline_ends(model_config, rest)
        if framework(framework_name).vocab_parallel:
            ends /= layout.tp
        return ep_local_params(model_config, layout, ends + per_stage * blocks.params)
    return counts.params / (layout.tp * layout.pp)  # approximate for the MLP's split
