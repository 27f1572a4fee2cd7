"""What one training step costs one rank of a layout: FLOPs, memory-bound bytes, memory by
category, and the bytes of every collective per mesh dimension.

The counts come from ``counts.py`` (one sample, one block, counted on meta tensors); this file
scales them by the layout, each rule in one place:

* FLOPs per rank: the model's per-sample FLOPs x samples in the step / ranks (data
  parallelism splits samples, tensor parallelism each matmul, a pipeline the layers), plus the
  blocks' forward again under activation checkpointing.
* Memory per rank, for decoders (any size, no trace): the state of this rank's parameters
  (``labkit.costs.model_state_bytes``: ZeRO-3 over fsdp, ZeRO-1 over dp for "zero1"), the
  activations autograd saves per block per sample (counted for one tp rank's block) x blocks
  on the stage x samples per micro-batch x micro-batches in flight (1; a 1F1B stage holds pp,
  GPipe all of them), and FSDP's two gathered blocks. Other models (the MLP, the DLRM) are
  traced whole by ``labkit.memory.estimate_memory`` (they are small, or their size is tables).
* Collectives (bytes of the tensor each works on; ``labkit.costs.ring_share`` gives what a rank
  sends): tp: one AllReduce per column/row pair forward and one backward, of a micro-batch's
  activations; dp: an AllReduce of the gradients (DDP, once per step); fsdp: an all-gather of
  the parameters in forward and again in backward per micro-batch, a reduce-scatter of the
  gradients; pp: a send of the activations forward and of their gradient backward per
  micro-batch.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field

from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

from labkit.costs import OPTIMIZER_STATE_COPIES, model_state_bytes
from labkit.layout.layout import Layout
from labkit.models import build_model, plan_for
from labkit.plan.counts import block_counts, is_decoder, rest_saved_bytes, sample_counts
from labkit.plan.cp_ep import cp_ep_comm, ep_local_params

DDP_BUCKET_BYTES = 25 * 2**20  # DDP's default bucket_cap_mb
DDP_FIRST_BUCKET_BYTES = 2**20  # DDP's first bucket (torch.distributed's default: 1 MiB)


@dataclass(frozen=True)
class Lever:
    """The per-run choices besides the layout (the ``TrainConfig`` levers)."""

    global_batch: int
    micro_batches: int = 1
    precision: str = "mixed"  # "fp32", "bf16", "mixed"
    activation_checkpointing: bool = False
    optimizer: str = "adam"
    # selective recomputation: True (or "attention"): Korthikanti et al. 2022's, the attention
    # core (scores, softmax) recomputed in backward; "op": torchtitan's op-level policy, every
    # op recomputed but the matmuls' and attention's outputs, of which every second matmul's
    selective_recompute: bool | str = False
    # Korthikanti et al. 2022: norms and residuals split over the tp ranks along the sequence
    sequence_parallel: bool = False
    # ZeRO over the dp replicas beside tp/pp (Megatron's distributed optimizer: 1; 2 shards
    # the gradients too); 0: none (the layout's own dp_kind still applies)
    zero_stage: int = 0
    # a fused attention kernel (FlashAttention): no seq x seq scores written or kept
    flash_attention: bool = True
    framework: str = "labkit"  # labkit.plan.frameworks.FRAMEWORKS


@dataclass
class StepCosts:
    """One rank's costs of one step.

    Attributes:
        flops: FLOPs this rank computes (recomputation included).
        model_flops: the model's FLOPs per step over all ranks (no recomputation): MFU's top.
        memory_bound_bytes: bytes moved by ops that are bandwidth-bound (embedding lookups and
            their gradients, the optimizer's passes over its state:
            ``counts.optimizer_counts``).
        memory: peak bytes by category; comm: {(dim, kind): (calls, tensor bytes)}.
        samples, tokens: per step, all ranks.
    """

    flops: float
    model_flops: float
    memory_bound_bytes: float
    memory: dict[str, float]
    comm: dict[tuple[str, str], tuple[int, float]] = field(default_factory=dict)
    samples: int = 0
    tokens: int = 0
    memory_method: str = "counted per block, scaled"

    @property
    def peak_bytes(self) -> float:
        return sum(self.memory.values())


def _zero_stage(layout: Layout, lever: Lever | None = None) -> tuple[int, int]:
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
    gradients, fp32 master and moments). The wire carries what memory holds (``step_comm``)."""
    from labkit.plan.frameworks import framework

    return framework(framework_name).state_recipe if precision == "mixed" else precision


def _optimizer_share(row: str, optimizer: str) -> float:
    """The part of ``model_state_bytes``'s Adam state that ``optimizer`` keeps: its moments
    (2 for Adam, 0 for SGD) per parameter, plus the fp32 master copy of a row that has one."""
    moment = 2 if row == "bf16" else 4
    master = 4 if row in ("mixed", "megatron") else 0
    adam = master + OPTIMIZER_STATE_COPIES["adam"] * moment
    return (master + OPTIMIZER_STATE_COPIES[optimizer] * moment) / adam


def compute_bytes(precision: str) -> int:
    return 4 if precision == "fp32" else 2


@functools.lru_cache(maxsize=64)
def _tp_pairs(model_config) -> list[tuple[int, int]]:
    """(column layer's input width, row layer's output width) of each tp pair, once per
    model; an AllReduce of a micro-batch's activations of that width runs in backward (at the
    column layer's input) and in forward (at the row layer's output)."""
    if is_decoder(model_config) and model_config.n_layers > 1:  # identical blocks
        return _tp_pairs(replace_layers(model_config, 1)) * model_config.n_layers
    model = build_model(model_config, device="meta")
    modules = dict(model.named_modules())
    styles = plan_for(model_config).tp_styles(model)
    cols = [modules[n].in_features for n, s in styles.items() if isinstance(s, ColwiseParallel)]
    rows = [modules[n].out_features for n, s in styles.items() if isinstance(s, RowwiseParallel)]
    return list(zip(cols, rows, strict=True))


def _tokens_per_sample(model_config) -> int:
    return getattr(model_config, "seq_len", 1)


def attention_flops(model_config) -> float:
    """Forward FLOPs of one sample's attention scores and weighted sum (Q K^T and P V,
    2 s^2 d each per layer): what the meta count's math path charges forward (backward twice
    that); 0 for a model without attention."""
    if not is_decoder(model_config):
        return 0.0
    return 4.0 * model_config.n_layers * model_config.seq_len ** 2 * model_config.d_model


def step_flops(model_config, layout: Layout, lever: Lever) -> tuple[float, float]:
    """(FLOPs of this rank, model FLOPs of the step over all ranks).

    Recomputation: full checkpointing reruns the blocks' forward; selective reruns the
    attention core (Korthikanti et al. 2022). A fused causal attention kernel (FlashAttention)
    skips the blocks above the diagonal (half the scores; Dao 2023, FlashAttention-2, section
    3.1.1) and its backward runs 5 of the matmuls where the forward runs 2 (it recomputes the
    scores: Algorithm 2), so it does 3.5 x 0.5 of the forward's attention FLOPs where the math
    path's forward and backward do 3, and selective recomputation adds nothing to it."""
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
    return per_sample * lever.global_batch / layout.size, model


def _activation_blocks(model_config, layout: Layout, lever: Lever,
                       flash_attention: bool) -> tuple:
    """(block counts, bytes one block saves per sample, its input's bytes per sample) on a
    tp rank: the seq x seq scores left out under fused attention or selective
    recomputation, the d_model-wide tensors split over tp under sequence parallelism."""
    no_scores = flash_attention or bool(lever.selective_recompute)
    blocks = block_counts(model_config, layout.tp, no_scores)
    saved, inputs = blocks.saved_bytes, blocks.input_bytes
    if lever.selective_recompute == "op":
        saved = op_policy_saved_bytes(model_config, layout.tp)
    if lever.sequence_parallel and layout.tp > 1:
        saved -= blocks.full_width_bytes * (1 - 1 / layout.tp)
        inputs /= layout.tp
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


def decoder_memory(model_config, layout: Layout, lever: Lever, measured: bool = False,
                   flash_attention: bool = True) -> dict[str, float]:
    """Peak bytes by category on the worst rank of a decoder layout (no trace)."""
    from labkit.plan.frameworks import framework

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
        last = in_blocks * (lever.micro_batches if layout.pipeline_schedule == "gpipe" else 1)
        per_sample = max(first, last + rest) + recompute
    activations = per_sample * width * micro / layout.cp  # cp: 2 of 2cp chunks a sequence
    other = 0.0
    if stage == 3 and shards > 1:  # FSDP2 gathers a block and prefetches the next
        other += 2 * blocks.params * compute_bytes(lever.precision)
    return {"parameters": state["parameters"], "gradients": state["gradients"],
            "optimizer": state["optimizer"], "activations": activations, "other": other}


def _head_params(model_config) -> int:
    return model_config.vocab_size * model_config.d_model + 2 * model_config.d_model


def _in_flight(layout: Layout, lever: Lever) -> int:
    """Micro-batches whose activations a stage holds at once (the first stage's)."""
    schedule = layout.pipeline_schedule
    if schedule is None:
        return 1
    if schedule in ("gpipe", "naive"):
        return lever.micro_batches
    return min(layout.pp, lever.micro_batches)


def step_comm(model_config, layout: Layout, lever: Lever, local_params: float,
              measured: bool = False) -> dict[tuple[str, str], tuple[int, float]]:
    """{(dim, collective): (calls, tensor bytes)} one rank issues in one step."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    m = lever.micro_batches
    micro = lever.global_batch // layout.data_size // m
    act = compute_bytes(lever.precision)  # activations travel in the compute dtype
    tokens = micro * _tokens_per_sample(model_config)
    if layout.tp > 1:
        pairs = _tp_pairs(model_config)
        share = 1 / layout.pp  # a stage's share of the pairs
        calls = 2 * len(pairs) * m * share
        width = sum(c + r for c, r in pairs)
        if lever.activation_checkpointing and is_decoder(model_config):
            # backward reruns each block's forward, and with it the row layers' forward
            # AllReduce, but torch.utils.checkpoint stops early (non-reentrant: once the last
            # tensor backward needs is recomputed): the block's last row layer's output is
            # not, so a block of k pairs recomputes k-1 AllReduces (measured: tests/test_plan)
            block = _tp_pairs(replace_layers(model_config, 1))
            again = [r for _, r in block[:-1]] * model_config.n_layers
            calls += len(again) * m * share
            width += sum(again)
        out[("tp", "all_reduce")] = (round(calls), width * tokens * act * m * share)
    if layout.pp > 1:
        from labkit.plan.frameworks import framework

        width = getattr(model_config, "d_model", 0) or model_config.d_hidden
        # a middle stage sends activations forward and gradients backward; an end stage one
        sends = m if layout.pp == 2 else 2 * m
        # Megatron's scatter/gather (or sequence parallelism): each tp rank sends 1/tp
        split = layout.tp if (framework(lever.framework).pp_scatter
                              or lever.sequence_parallel) else 1
        out[("pp", "send")] = (sends, sends * tokens * width * act / split)
    grads = local_params * (4 if lever.precision != "bf16" else 2)
    if layout.cp > 1 or layout.ep > 1:
        sharded = 1 / layout.fsdp if layout.data_engine == "fsdp" else 1.0
        out.update(cp_ep_comm(model_config, layout, micro, m, 4 if lever.precision != "bf16"
                              else 2, sharded))
        if layout.ep > 1:  # replicas averaged by hand (in cp_ep_comm), not by DDP
            return out
    engine = layout.data_engine
    if engine == "tables":
        from labkit.plan.recommender import table_comm

        out.update(table_comm(model_config, layout, lever))
        return out
    if engine == "fsdp":
        # FSDP2 gathers each block in forward and again in backward, the root (embeddings,
        # head) once: it stays gathered from its forward to its backward
        units = _units(model_config, layout)
        blocks = _block_share(model_config, layout, local_params)
        gathered = (local_params + blocks) * compute_bytes(lever.precision)
        if layout.fsdp > 1:
            out[("fsdp", "all_gather")] = ((2 * units - 1) * m, m * gathered)
            out[("fsdp", "reduce_scatter")] = (units, grads)
        if layout.dp > 1:
            out[("dp", "all_reduce")] = (units, grads / layout.fsdp)
    elif engine in ("ddp", "zero1", "naive") and layout.dp > 1:
        out[("dp", "all_reduce")] = (gradient_buckets(grads, local_params, layout.dp,
                                                      lever.framework), grads)
        if engine == "zero1":
            out[("dp", "broadcast")] = (1, local_params * 4)
    return out


def gradient_buckets(grad_bytes: float, params: float, dp: int,
                     framework_name: str = "labkit") -> int:
    """Collectives a step's gradient reduction issues, as the framework buckets it
    (``labkit.plan.frameworks``): torch DDP's via ``ddp_buckets``."""
    from labkit.plan.frameworks import framework

    if framework_name == "labkit":
        return ddp_buckets(grad_bytes)
    bucket = framework(framework_name).bucket_bytes(params, dp, grad_bytes)
    return max(1, math.ceil(grad_bytes / bucket))


def ddp_buckets(grad_bytes: float) -> int:
    """AllReduces DDP issues per step for ``grad_bytes`` of gradients: a small first bucket
    (the last layers' gradients, ready first, sent early), then buckets of bucket_cap_mb."""
    rest = max(0.0, grad_bytes - DDP_FIRST_BUCKET_BYTES)
    return 1 + math.ceil(rest / DDP_BUCKET_BYTES)


def _block_share(model_config, layout: Layout, local: float) -> float:
    """Parameters of a rank's FSDP units other than the root (its blocks or linears)."""
    if is_decoder(model_config):
        return math.ceil(model_config.n_layers / layout.pp) * block_counts(
            model_config, layout.tp).params
    return local  # the MLP: every linear is a unit, the root holds none


def _units(model_config, layout: Layout) -> int:
    """FSDP units on a rank: each block (each linear of the MLP) and the root."""
    layers = getattr(model_config, "n_layers", 1)
    return math.ceil(layers / layout.pp) + 1


def replace_layers(model_config, n_layers: int):
    return dataclasses.replace(model_config, n_layers=n_layers)


def local_params(model_config, layout: Layout, framework_name: str = "labkit") -> float:
    """Parameters one rank holds before any ZeRO sharding (split by tp and pp; the embedding
    and head split over tp too where the framework's are vocab-parallel)."""
    from labkit.plan.frameworks import framework

    counts = sample_counts(model_config)
    if is_decoder(model_config):
        blocks = block_counts(model_config, layout.tp)
        rest = counts.params - model_config.n_layers * blocks.full_params
        per_stage = math.ceil(model_config.n_layers / layout.pp)
        # the worst stage holds the larger end (embeddings or norm + head) beside its blocks
        ends = rest if layout.pp == 1 else max(rest - _head_params(model_config),
                                               _head_params(model_config))
        if framework(framework_name).vocab_parallel:
            ends /= layout.tp
        return ep_local_params(model_config, layout, ends + per_stage * blocks.params)
    return counts.params / (layout.tp * layout.pp)  # approximate for the MLP's split
