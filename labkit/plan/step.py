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


def _zero_stage(layout: Layout) -> tuple[int, int]:
    """(ZeRO stage, ranks it shards over) of the layout's data-parallel engine."""
    engine = layout.data_engine
    if engine == "fsdp":
        return 3, layout.fsdp
    if engine == "zero1":
        return 1, layout.dp
    return 0, 1


def _state_precision(precision: str, measured: bool = False) -> str:
    """The ``model_state_bytes`` row of labkit's precision lever, on any cluster: "mixed"
    keeps fp32 weights, fp32 gradients (reduced in fp32: FSDP2's ``reduce_dtype``, DDP on
    fp32 parameters) and fp32 Adam moments, computing in bf16 (autocast, or FSDP2's
    ``param_dtype``): the "fp32" row, 16 B per parameter with Adam, the same total as the ZeRO
    paper's "mixed" row (2 + 2 + 12). The wire carries what memory holds (``step_comm``)."""
    return "fp32" if precision == "mixed" else precision


def _optimizer_share(row: str, optimizer: str) -> float:
    """The part of ``model_state_bytes``'s Adam state that ``optimizer`` keeps: its moments
    (2 for Adam, 0 for SGD) per parameter, plus the fp32 master copy of the "mixed" row."""
    moment = 2 if row == "bf16" else 4
    master = 4 if row == "mixed" else 0
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


def step_flops(model_config, layout: Layout, lever: Lever) -> tuple[float, float]:
    """(FLOPs of this rank, model FLOPs of the step over all ranks)."""
    counts = sample_counts(model_config)
    model = counts.flops * lever.global_batch
    recompute = counts.block_forward_flops * lever.global_batch if (
        lever.activation_checkpointing) else 0.0
    return (model + recompute) / layout.size, model


def decoder_memory(model_config, layout: Layout, lever: Lever, measured: bool = False,
                   flash_attention: bool = True) -> dict[str, float]:
    """Peak bytes by category on the worst rank of a decoder layout (no trace)."""
    blocks = block_counts(model_config, layout.tp, flash_attention)
    per_stage = math.ceil(model_config.n_layers / layout.pp)
    counts = sample_counts(model_config)
    rest = counts.params - model_config.n_layers * blocks.full_params
    # the worst stage holds the larger end (embeddings or norm + head) beside its blocks
    ends = rest if layout.pp == 1 else max(rest - _head_params(model_config),
                                           _head_params(model_config))
    local = ep_local_params(model_config, layout, ends + per_stage * blocks.params)
    stage, shards = _zero_stage(layout)
    row = _state_precision(lever.precision, measured)
    state = model_state_bytes(local, shards, stage, row)
    state["optimizer"] *= _optimizer_share(row, lever.optimizer)
    micro = lever.global_batch // layout.data_size // lever.micro_batches
    width = compute_bytes(lever.precision) / 4  # counted in fp32; bf16 saves half
    if lever.activation_checkpointing:  # block inputs kept, one block recomputed at a time
        in_blocks = per_stage * blocks.input_bytes
        recompute = blocks.saved_bytes
    else:
        in_blocks, recompute = per_stage * blocks.saved_bytes, 0.0
    rest = rest_saved_bytes(model_config)
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
        width = getattr(model_config, "d_model", 0) or model_config.d_hidden
        # a middle stage sends activations forward and gradients backward; an end stage one
        sends = m if layout.pp == 2 else 2 * m
        out[("pp", "send")] = (sends, sends * tokens * width * act)
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
        out[("dp", "all_reduce")] = (ddp_buckets(grads), grads)
        if engine == "zero1":
            out[("dp", "broadcast")] = (1, local_params * 4)
    return out


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


def local_params(model_config, layout: Layout) -> float:
    """Parameters one rank holds before any ZeRO sharding (split by tp and pp)."""
    counts = sample_counts(model_config)
    if is_decoder(model_config):
        blocks = block_counts(model_config, layout.tp)
        rest = counts.params - model_config.n_layers * blocks.full_params
        per_stage = math.ceil(model_config.n_layers / layout.pp)
        ends = rest if layout.pp == 1 else max(rest - _head_params(model_config),
                                               _head_params(model_config))
        return ep_local_params(model_config, layout, ends + per_stage * blocks.params)
    return counts.params / (layout.tp * layout.pp)  # approximate for the MLP's split
