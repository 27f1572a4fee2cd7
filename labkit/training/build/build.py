"""The one build path: a run's layout turned into this rank's model, in a fixed order.

    1. the model on the meta device (``labkit/models``): shapes, no memory;
       (the DLRM with ``tables=``: its tables placed over fsdp, ``labkit/parallel/embedding``)
    2. tensor parallelism on ``mesh["tp"]``: DTensor's ``parallelize_module`` with the model's
       plan (``labkit/models/*_split.py``; the lesson is in ``labkit/parallel/tensor``), or
       with ``tp_kind="naive"`` the same plan carried out by labkit's hand-written layers;
    3. the pipeline split over ``mesh["pp"]``: this rank's stages (``labkit/parallel/pipeline``);
    4. FSDP2 on each part, still on meta: ``fully_shard`` over fsdp (HSDP over dp x fsdp), or
       ``replicate`` over dp when the replica is split by tp or pp
       (``labkit/parallel/sharded``);
    5. one allocator: this rank's shards allocated and filled from the host model
       (``materialize.py``);
    6. engines that wrap real weights: DDP over dp, ZeRO-1's optimizer, the hand-written
       broadcast (``labkit/parallel/data``), then the optimizer and the pipeline schedule.

The order is torchtitan's (``parallelize_llama``: TP, then FSDP, the pipeline splitting the
model from outside). DDP and ZeRO-1 come after allocation because they copy weights that
exist; FSDP2 comes before, so that only shards are ever allocated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.distributed._composable import checkpoint
from torch.distributed.tensor.parallel import parallelize_module

from labkit.models import build_model, loss_fn, plan_for
from labkit.models.optim import make_optimizer, weight_dtype
from labkit.parallel.context.apply import apply_cp
from labkit.parallel.data.ddp import wrap_ddp
from labkit.parallel.data.naive import broadcast_parameters
from labkit.parallel.embedding.tables import shard_tables, table_plan
from labkit.parallel.expert.apply import shard_experts
from labkit.parallel.pipeline.schedule import PipelineRunner
from labkit.parallel.pipeline.stages import split_stages, stage_ids, stage_module
from labkit.parallel.sharded.fsdp import (
    apply_fsdp,
    apply_replicate,
    fsdp_no_sync,
    shard_dims,
)
from labkit.parallel.sharded.zero import zero1_optimizer
from labkit.parallel.tensor.apply import apply_naive_tp
from labkit.runtime.memory.capacity import on_host
from labkit.training.build.context import ParallelContext
from labkit.training.build.materialize import materialize
from labkit.training.build.sync import (
    AverageGradients,
    ExpertGradients,
    LocalShards,
    SyncStep,
    TableGradients,
    run_sync,
)


@dataclass
class Built:
    """This rank's model for a run, ready to train.

    Attributes:
        parts: its pieces, unwrapped (one; two stages with interleaved 1F1B).
        names: per part, its tensor names -> the whole model's ({} where they are equal).
        modules: the parts as they run (wrapped by DDP where it applies).
        optimizer: over every part's parameters.
        pipeline: the stages' schedule, or None without a pipeline.
        grad_sync: the hand-written gradient communication after backward, in the order
            it runs (``sync.py``); empty where the engines synchronise by themselves.
        no_sync: a context that keeps gradients local (micro-batches), or None.
        overlaps_comm: gradients are AllReduced during backward (DDP's buckets).
        table_plan: the DLRM's table placement, or None.
        engine_casts: FSDP2's ``MixedPrecisionPolicy`` makes the bfloat16 copies for
            precision="mixed", so the step does not autocast.
    """

    parts: list[nn.Module]
    names: list[dict[str, str]]
    modules: list[nn.Module]
    optimizer: torch.optim.Optimizer
    pipeline: PipelineRunner | None = None
    grad_sync: tuple[SyncStep, ...] = ()
    no_sync: Any = None
    overlaps_comm: bool = False
    table_plan: Any = None
    engine_casts: bool = False

    @property
    def model(self) -> nn.Module:
        """The one module of a layout without a pipeline."""
        return self.modules[0]

    def sync_gradients(self) -> None:
        """Run ``grad_sync``, step by step."""
        run_sync(self.grad_sync)


def _split(model: nn.Module, plan, ctx: ParallelContext):
    """Step 3: this rank's stages and their names, or the whole model."""
    layout, engines = ctx.layout, ctx.engines
    if not engines.pipelined:
        return [model], [{}], None
    per_rank = engines.stages_per_rank
    cut = split_stages(plan.layers(model), ctx.run.stages)
    ids = stage_ids(ctx.coordinate("pp"), layout.pp, per_rank)
    parts, names = zip(*(stage_module(cut[i]) for i in ids), strict=True)
    return list(parts), list(names), ids


def _shard(parts: list[nn.Module], plan, ctx: ParallelContext,
           precision: str = "fp32") -> list[nn.Module]:
    """Step 4: FSDP2's engines, on the meta device."""
    layout, engine = ctx.layout, ctx.engines.data_engine
    if engine == "fsdp":
        mesh = ctx.submesh(*shard_dims(layout))
        return [apply_fsdp(part, plan.fsdp_units(part), mesh, precision) for part in parts]
    if engine == "ddp" and (layout.tp > 1 or ctx.engines.pipelined):
        return [apply_replicate(part, ctx.submesh("dp")) for part in parts]
    return parts


def plain_ddp(run) -> bool:
    """PyTorch's DDP (or ZeRO-1 over it) wraps whole replicas: no tp, no pipeline, no
    experts (whose replicas are averaged by hand)."""
    return run.engines.data_engine in ("ddp", "zero1") and not (
        run.layout.tp > 1 or run.engines.pipelined or run.layout.ep > 1)


def _replicate(parts, ctx: ParallelContext, config) -> tuple[list[nn.Module], dict]:
    """Step 6: engines that wrap allocated weights; returns the modules that run and what
    the step needs to know about them."""
    engine = ctx.engines.data_engine
    if ctx.layout.ep > 1:  # the experts' replicas are averaged by hand (``_grad_sync``)
        return parts, {}
    fake = any(is_fake(p) for part in parts for p in part.parameters())
    if plain_ddp(ctx.run) and fake:  # DDP does not run on fake tensors: the replica alone
        return parts, {}
    if plain_ddp(ctx.run):
        modules = [wrap_ddp(part, ctx.group("dp"), ctx.device, config.bucket_cap_mb,
                            ctx.memory) for part in parts]
        return modules, {"overlaps_comm": True, "no_sync": modules[0].no_sync}
    if engine in ("fsdp", "ddp"):  # FSDP2's fully_shard or replicate
        return parts, {"no_sync": fsdp_no_sync(parts)}
    if engine == "naive":
        for part in parts:
            broadcast_parameters(LocalShards(part), ctx.group("dp"))
    return parts, {}


def _grad_sync(parts, ctx: ParallelContext) -> tuple[SyncStep, ...]:
    """The hand-written gradient sync, in order: the data-parallel engine's (naive
    AllReduce, the tables', the experts'), then the mean over cp."""
    layout, engine, steps = ctx.layout, ctx.engines.data_engine, []
    if layout.ep > 1:  # replicas averaged by hand, experts not (DDP would average all)
        steps.append(ExpertGradients(tuple(parts), ctx.group("dp")))
    elif engine == "naive":
        steps.append(AverageGradients(tuple(parts), ctx.group("dp"), "dp"))
    elif engine == "tables":
        steps.append(TableGradients(parts[0], ctx.mesh, layout))
    if layout.cp > 1:
        steps.append(AverageGradients(tuple(parts), ctx.group("cp"), "cp"))
    return tuple(steps)


def _optimizer(parts, ctx: ParallelContext, config) -> torch.optim.Optimizer:
    params = [p for part in parts for p in part.parameters()]
    if ctx.engines.data_engine == "zero1":
        return zero1_optimizer(params, config.optimizer, config.lr, ctx.group("dp"))
    return make_optimizer(config.optimizer, params, config.lr)


def _on_meta(ctx: ParallelContext, config, plan):
    """Steps 1-4, on meta tensors: this rank's parts, their names, stage ids, tables."""
    layout, engines = ctx.layout, ctx.engines
    model = build_model(config.model, "meta", config.seed, weight_dtype(config.precision))
    placement = None
    if engines.tables is not None:
        placement = table_plan(config, layout, engines.tables, ctx.memory)
        model = shard_tables(model, placement, ctx.submesh("fsdp"), engines.tables)
    if engines.tp_kind == "naive":  # labkit's Megatron layers: f and g by hand
        apply_naive_tp(model, plan.tp_styles(model), ctx.submesh("tp"))
    elif layout.tp > 1:
        parallelize_module(model, ctx.submesh("tp"), plan.tp_styles(model))
    if layout.ep > 1:  # this rank's experts only (DTensors over dp), all-to-all over dp
        shard_experts(model, ctx.submesh("dp"), ctx.group("dp"))
    if layout.cp > 1:  # ring attention over cp; weights untouched (replicated over cp)
        apply_cp(plan, model, ctx.group("cp"), ctx.coordinate("cp"), layout.cp,
                 engines.cp_engine)
    if config.activation_checkpointing:  # after TP, before FSDP (torchtitan's order)
        for unit in plan.checkpoint_units(model):
            checkpoint(unit)  # composable: hooks only, the weights keep their names
    parts, names, ids = _split(model, plan, ctx)
    return _shard(parts, plan, ctx, config.precision), names, ids, placement


def build(ctx: ParallelContext) -> Built:
    """This rank's model for ``ctx.run`` (its config, layout and engines)."""
    config, layout, engines = ctx.config, ctx.layout, ctx.engines
    plan = plan_for(config.model)
    # Steps 1-4 work on meta tensors (shapes, no memory) and on the mesh's host tensors:
    # plain ones, also while the estimator traces the steps after them on fake tensors.
    with on_host():
        parts, names, ids, placement = _on_meta(ctx, config, plan)
    materialize(parts, names, config, layout.tp, ctx.device)
    modules, engine = _replicate(parts, ctx, config)
    optimizer = _optimizer(parts, ctx, config)
    pipeline = None
    if engines.pipelined:
        pipeline = PipelineRunner(modules, ids, ctx.run.stages, ctx.coordinate("pp"),
                                  layout.pp, ctx.group("pp"), ctx.device,
                                  config.micro_batches, loss_fn(config.model),
                                  engines.schedule, ctx.clock)
    casts = engines.data_engine == "fsdp" and config.precision == "mixed"
    return Built(parts, names, modules, optimizer, pipeline, _grad_sync(parts, ctx),
                 table_plan=placement, engine_casts=casts, **engine)
