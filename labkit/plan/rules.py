"""What a planned layout must pass on a named cluster; each refusal says what to change.

These are the rules of a real run, not of labkit's CPU ranks (labkit runs pipelines in fp32
only; a GPU run need not): the layout fills the cluster, tp divides the heads (or the MLP's
width) and stays inside a node, the pipeline has layers and micro-batches enough, the batch
splits over the data ranks and micro-batches.
"""

from __future__ import annotations

import warnings

from labkit.models import DLRMConfig, GPTConfig, MLPConfig, plan_for
from labkit.plan.frameworks import framework
from labkit.plan.parallelism import Parallelism
from labkit.runtime.costs import OPTIMIZER_STATE_COPIES

PRECISIONS = ("fp32", "bf16", "mixed", "fp16")


class PlanError(ValueError):
    """A layout, batch or cluster the planner refuses, with the reason and the fix."""


# A global batch of sequences beyond this is more likely a count of tokens: published runs
# train with 512 to 16k sequences a step (Llama 3 405B: 2,048 of 8,192 tokens, 16M tokens).
TOKENS_NOT_SEQUENCES = 100_000


def warn_tokens_as_batch(model_config, global_batch) -> None:
    """Warn when ``global_batch`` looks like tokens where samples (sequences) are meant."""
    seq = getattr(model_config, "seq_len", 1)
    if isinstance(global_batch, int) and global_batch > TOKENS_NOT_SEQUENCES and seq > 1:
        warnings.warn(f"global_batch={global_batch:,} counts samples (sequences of {seq} "
                      f"tokens): {global_batch * seq:,} tokens a step. If you meant tokens, "
                      f"pass global_batch={max(global_batch // seq, 1):,}", stacklevel=3)


def check_lever(lever) -> None:
    """Raise ``PlanError`` for a batch, micro-batch count, ZeRO stage, chunk count, precision
    or optimizer that no layout could run."""
    for name in ("global_batch", "micro_batches"):
        value = getattr(lever, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PlanError(f"{name} is a whole number, at least 1, not {value!r}")
    zero = getattr(lever, "zero_stage", 0)
    if isinstance(zero, bool) or zero not in (0, 1, 2):
        raise PlanError(f"zero_stage is 0, 1 (optimizer state sharded over dp) or 2 (and the "
                        f"gradients), not {zero!r}: for parameters sharded too (ZeRO-3) use "
                        "fsdp, Parallelism.of(fsdp=N, dp_kind='fsdp')")
    chunks = getattr(lever, "virtual_stages", 0)
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 0:
        raise PlanError(f"virtual_stages is a whole number of model chunks per pipeline rank "
                        f"(0: the layout's schedule decides, 2 or more interleave), not "
                        f"{chunks!r}")
    if lever.precision not in PRECISIONS:
        raise PlanError(f"precision is one of {PRECISIONS}, not {lever.precision!r}")
    if lever.optimizer not in OPTIMIZER_STATE_COPIES:
        raise PlanError(f"optimizer is one of {tuple(OPTIMIZER_STATE_COPIES)}, not "
                        f"{lever.optimizer!r}")


def check_layout(model_config, layout: Parallelism, cluster, lever) -> None:
    """Raise ``PlanError`` unless ``layout`` can train ``model_config`` on ``cluster``."""
    check_lever(lever)
    if layout.size != cluster.world_size:
        raise PlanError(f"the layout {layout} uses {layout.size} GPUs and the cluster {cluster}"
                        f" has {cluster.world_size}: choose degrees whose product is "
                        f"{cluster.world_size}")
    if layout.tp > cluster.gpus_per_node:
        raise PlanError(f"tp={layout.tp} would cross nodes ({cluster.gpus_per_node} GPUs per "
                        "node): tensor parallelism talks in every layer and needs the node's "
                        "links; keep tp <= GPUs per node")
    if cluster.gpus_per_node % layout.tp:
        raise PlanError(f"tp={layout.tp} does not divide the {cluster.gpus_per_node} GPUs of a "
                        "node: some tp groups would straddle two nodes; choose a tp that "
                        f"divides {cluster.gpus_per_node}")
    if (layout.tp > 1 or layout.pipelined) and not isinstance(model_config, GPTConfig | MLPConfig):
        raise PlanError("tensor parallelism splits the decoder's and the MLP's matrices; a "
                        "recommender's tables are split over fsdp (tables='table_wise')")
    if layout.tables is not None and not isinstance(model_config, DLRMConfig):
        raise PlanError(f"tables={layout.tables!r} places a recommender's embedding tables "
                        f"over fsdp; {type(model_config).__name__} has none: leave tables out")
    if layout.tp > 1:
        try:
            plan_for(model_config).check_tp(model_config, layout.tp)
        except ValueError as error:
            raise PlanError(str(error)) from None
    if layout.pp > 1 and not framework(lever.framework).pipelines:
        raise PlanError(f"the {lever.framework} framework has no pipeline parallelism: "
                        "choose pp=1, or a framework that pipelines")
    _check_batch(layout, lever)
    _check_cp_ep(model_config, layout)
    if layout.pipelined:
        _check_pipeline(model_config, layout, lever)


def _check_cp_ep(model_config, layout: Parallelism) -> None:
    """cp and ep as the planner projects them: ring attention on a decoder's sequences,
    beside dp, fsdp and tp (Megatron-Core's cp x tp), not pp; experts over exactly the dp
    ranks, a whole number of experts each."""
    from labkit.plan.cp_ep import is_moe

    if layout.cp > 1:
        if not isinstance(model_config, GPTConfig):
            raise PlanError("cp splits a decoder's sequences; this model has no attention")
        if layout.pipelined:
            raise PlanError("cp composes with dp, fsdp and tp here, not with pp: use "
                            "Layout(dp=..., fsdp=..., cp=..., tp=...)")
        if model_config.seq_len % (2 * layout.cp):
            raise PlanError(f"cp={layout.cp} cuts each sequence into {2 * layout.cp} chunks: "
                            f"seq_len {model_config.seq_len} is not a multiple of "
                            f"{2 * layout.cp}")
    if layout.ep > 1:
        if not is_moe(model_config):
            raise PlanError("ep cuts a mixture of experts' experts; this model has none "
                            "(use labkit.models.moe.MoEGPTConfig)")
        if layout.ep != layout.dp or model_config.n_experts % layout.ep:
            raise PlanError(f"ep borrows the dp ranks: ep must equal dp (here {layout.dp}) "
                            f"and divide the {model_config.n_experts} experts")


def _check_batch(layout: Parallelism, lever) -> None:
    split = layout.data_size * lever.micro_batches
    if lever.global_batch % split:
        raise PlanError(f"global batch {lever.global_batch} does not split over "
                        f"{layout.data_size} data ranks x {lever.micro_batches} micro-batches:"
                        f" choose a multiple of {split}")


def _check_pipeline(model_config, layout: Parallelism, lever) -> None:
    layers = getattr(model_config, "n_layers", 0)
    if layers < layout.pp:
        raise PlanError(f"{layout.pp} stages need {layout.pp} layers at least; the model has "
                        f"{layers}")
    schedule = layout.pipeline_schedule
    chunks = getattr(lever, "virtual_stages", 0)
    if chunks and layers < layout.pp * chunks:
        raise PlanError(f"virtual_stages={chunks} puts {layout.pp * chunks} model chunks on "
                        f"{layout.pp} stages: the model has {layers} layers; choose "
                        f"virtual_stages <= {max(layers // layout.pp, 1)}")
    if schedule in ("1f1b", "interleaved_1f1b") and lever.micro_batches < layout.pp:
        raise PlanError(f"1F1B keeps {layout.pp} stages busy only with {layout.pp} "
                        f"micro-batches or more (got {lever.micro_batches}): the batch per "
                        "data rank is too small for this pipeline")
