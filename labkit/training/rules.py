"""The rules a run must pass before any process starts, each error saying what to change:
the fields that go together, the engines the layout asks for, and the layout against the
ranks, the model, the batch, the levers and the device. Called by ``resolve`` alone
(``labkit/training/run.py``): a run is checked there, once."""

from __future__ import annotations

from labkit.models import plan_for
from labkit.training.engines import CHOICE_FIELDS
from labkit.training.layout.layout import Layout


def check_fields(config) -> None:
    """Fields of a ``TrainConfig`` that only make sense together."""
    if config.layout is not None and config.strategy != "single":
        raise ValueError(f"give a strategy name or a layout, not both (strategy="
                         f"{config.strategy!r}, layout={config.layout})")
    chosen = {n: getattr(config, n) for n in CHOICE_FIELDS if getattr(config, n) is not None}
    if chosen and config.layout is None:
        named = ", ".join(f"{n}={v!r}" for n, v in chosen.items())
        raise ValueError(f"{named} chooses an engine for a layout, and strategy "
                         f"{config.strategy!r} has its own: give layout=labkit.Layout(...) "
                         f"with it, or the strategy alone")
    for name in ("checkpoint_every", "checkpoint_keep"):
        if getattr(config, name) is not None and config.checkpoint_dir is None:
            raise ValueError(f"{name}={getattr(config, name)} needs a checkpoint_dir to save "
                             f"into: give TrainConfig.checkpoint_dir")
    if config.checkpoint_async and config.checkpoint_dir is None:
        raise ValueError("checkpoint_async=True needs a checkpoint_dir to save into: give "
                         "TrainConfig.checkpoint_dir")
    if config.tp_kind == "naive" and config.checkpoint_dir is not None:
        raise ValueError("tp_kind='naive' keeps each rank's shard of a weight as a plain "
                         "tensor, which torch.distributed.checkpoint saves as one whole "
                         "weight (rank 0's shard): leave out checkpoint_dir, or checkpoint "
                         "with tp_kind='dtensor', whose DTensors DCP saves shard by shard")


def check_engine_choices(layout: Layout, schedule: str | None = None,
                         dp_kind: str | None = None, tables: str | None = None,
                         tp_kind: str | None = None) -> None:
    """Engine choices that no engine runs with these degrees, refused with what to write
    instead."""
    if tp_kind is not None:
        _check_tp_kind(layout, tp_kind, schedule, dp_kind, tables)
    kind = dp_kind
    if kind in ("ddp", "naive", "zero1") and layout.fsdp > 1:
        raise ValueError(f"dp_kind={kind!r} replicates the model, but fsdp={layout.fsdp} "
                         "shards it: write dp= for replicas, or dp_kind='fsdp' (HSDP when dp "
                         "> 1 too)")
    if kind == "fsdp" and layout.fsdp == 1 and layout.dp > 1:
        raise ValueError(f"dp_kind='fsdp' shards over the fsdp dimension, which is 1 here: "
                         f"write fsdp={layout.dp} instead of dp={layout.dp}, or dp_kind='ddp'")
    pipelined = layout.pp > 1 or schedule is not None
    if kind == "zero1" and (layout.tp > 1 or pipelined):
        raise ValueError("dp_kind='zero1' runs on plain replicas only (no tp, no pp): for "
                         "split replicas shard the optimizer state with fsdp= instead")
    if layout.ep > 1 and layout.ep != layout.dp:
        n = max(layout.dp, layout.ep)  # keep the ranks the user asked for
        raise ValueError(f"ep={layout.ep} must equal dp (here {layout.dp}): the experts are cut "
                         f"over the dp ranks; write Layout(dp={n}, ep={n})")
    if layout.ep > 1 and kind not in (None, "naive"):
        raise ValueError(f"ep={layout.ep} averages the replicated weights by hand and the "
                         f"experts' not at all, so dp_kind={kind!r} cannot run it: leave dp_kind "
                         "out (or dp_kind='naive')")
    if tables is not None:
        if kind is not None:
            raise ValueError(f"tables={tables!r} averages the dense part by hand over "
                             f"dp x fsdp: leave dp_kind out (not {kind!r})")
        if layout.tp > 1 or pipelined:
            raise ValueError(f"tables={tables!r} splits the DLRM's tables over fsdp; tp "
                             "and pp split the other zoo models: leave them at 1")


def _check_tp_kind(layout: Layout, tp_kind: str, schedule, dp_kind, tables) -> None:
    """``tp_kind`` needs a tp dimension; "naive" (plain tensors holding each rank's shard,
    which no other engine knows as shards) composes with hand-written data parallelism
    only."""
    if layout.tp == 1:
        raise ValueError(f"tp_kind={tp_kind!r} chooses what splits the matrices over tp, and "
                         f"the layout {layout} has tp=1: give it tp > 1 (Layout(tp=2)) or "
                         "leave tp_kind out")
    if tp_kind != "naive":
        return
    others = [f"{dim}={getattr(layout, dim)}" for dim in ("fsdp", "pp", "cp", "ep")
              if getattr(layout, dim) > 1]
    others += [f"schedule={schedule!r}"] if schedule is not None else []
    others += [f"tables={tables!r}"] if tables is not None else []
    if layout.dp > 1 and dp_kind != "naive":
        others.append(f"dp={layout.dp} with dp_kind={dp_kind or 'ddp'!r}")
    elif dp_kind not in (None, "naive"):  # named without its dimension: still wraps them
        others.append(f"dp_kind={dp_kind!r}")
    if others:
        raise ValueError(f"tp_kind='naive' splits the layers with labkit's hand-written "
                         f"Megatron layers, whose weights are plain tensors holding this "
                         f"rank's shard: FSDP2, DDP's replicate, the pipeline's stages and "
                         f"the other engines would take them for whole weights, so it does "
                         f"not compose with {', '.join(others)}. Use tp alone (or with dp "
                         f"and dp_kind='naive'), or tp_kind='dtensor' for composed layouts")


def check_run(run) -> None:
    """Raise ValueError if ``run`` (a Run, its engines resolved) cannot train."""
    config, layout, engines = run.config, run.layout, run.engines
    world_size, device, backend = run.world_size, run.device_type, run.backend
    if layout.size != world_size:
        raise ValueError(f"the layout {layout} needs {layout.size} ranks and the cluster has "
                         f"{world_size}: resize the cluster (cluster.resize({layout.size})) or "
                         f"choose degrees whose product is {world_size}")
    _check_batch(config, layout)
    plan = plan_for(config.model)
    _check_levers(config, engines, plan)
    plan.check_tp(config.model, layout.tp)
    if layout.cp > 1:
        _check_cp(config, layout, engines, plan)
        if device == "cuda" and backend != "nccl":
            raise ValueError("ring attention sends key/value blocks point to point, which gloo "
                             "cannot do with GPU tensors (ranks sharing GPUs talk over gloo): "
                             "give each rank its own GPU, or use device='cpu'")
    elif config.cp_engine != "auto":  # nothing would run the chosen engine
        raise ValueError(f"cp_engine={config.cp_engine!r} chooses what runs context "
                         f"parallelism, and the layout {layout} has cp=1: give it cp > 1 "
                         f"(Layout(cp=...)) or leave cp_engine='auto'")
    if layout.ep > 1 or plan.family == "moe_gpt":
        _check_experts(config, layout, plan)
    if engines.pipelined:  # the model first: no micro-batch count makes it a chain
        plan.check_pipeline(config.model, run.stages)
        _check_pipeline(config, layout.pp, engines.schedule)
        if device == "cuda" and backend != "nccl":
            raise ValueError("a pipeline on GPUs that ranks share talks over gloo, and gloo "
                             "cannot send GPU tensors point to point: give each rank its own "
                             "GPU (as many ranks as GPUs), or use device='cpu'")
    if engines.tables is not None:
        plan.check_tables(config.model, engines.tables, layout.fsdp)


def _check_cp(config, layout: Layout, engines, plan) -> None:
    """Context parallelism: a model with attention, sequences that cut into 2 x cp chunks,
    and the dimensions it has been built and tested with (dp, fsdp)."""
    plan.check_cp(config.model, layout.cp)
    if layout.tp > 1 or engines.pipelined:
        raise ValueError(f"cp={layout.cp} composes with dp and fsdp here, not with tp or pp: "
                         "use Layout(dp=..., fsdp=..., cp=...)")
    if config.precision != "fp32":
        raise ValueError(f"ring attention runs in fp32 here (its online softmax keeps fp32 "
                         f"log-sum-exps): use precision='fp32' with cp, not "
                         f"{config.precision!r}")
    if config.activation_checkpointing:
        raise ValueError("activation checkpointing would run the ring again in backward; it is "
                         "not built with cp here: use activation_checkpointing=False")


def _check_experts(config, layout: Layout, plan) -> None:
    """Expert parallelism: a mixture of experts whose experts split over the dp ranks, and
    no other split of it (it is built with data parallelism only); one micro-step per step
    (the load-balancing loss is not scaled by micro-steps)."""
    if plan.family != "moe_gpt":
        raise ValueError(f"ep={layout.ep} spreads a mixture of experts' experts; "
                         f"{plan.family!r} has none: choose model=labkit.models.MoEGPTConfig()")
    plan.check_ep(config.model, layout.ep)
    if layout.fsdp > 1 or layout.cp > 1:
        raise ValueError("the MoE GPT is built with dp (and ep) only here: use fsdp=1, cp=1")
    if config.micro_batches * config.grad_accumulation > 1:
        raise ValueError("the MoE GPT runs one micro-step per step here: use micro_batches=1 "
                         "and grad_accumulation=1")


def _check_levers(config, engines, plan) -> None:
    """The memory levers (precision, gradient accumulation, activation checkpointing)."""
    if config.activation_checkpointing:
        plan.check_checkpointing(config.model)
    if engines.pipelined and config.grad_accumulation > 1:
        raise ValueError("a pipeline already accumulates gradients over its micro-batches: "
                         f"set micro_batches={config.micro_batches * config.grad_accumulation}"
                         " and grad_accumulation=1")
    if engines.pipelined and config.precision != "fp32":
        raise ValueError(f"precision={config.precision!r} is not applied to pipeline stages "
                         "here: use precision='fp32' with a pipeline, or a layout without one")


def _check_batch(config, layout: Layout) -> None:
    batch, slices = config.global_batch, layout.data_size
    micro = config.micro_batches * config.grad_accumulation
    if slices == 1 and batch % micro:
        raise ValueError(f"global_batch {batch} does not split into {micro} micro-batches: "
                         "choose a multiple")
    if batch % (slices * micro):
        raise ValueError(f"global_batch {batch} does not split evenly over {slices} ranks x "
                         f"{micro} micro-batches: choose a multiple of {slices * micro}")


def _check_pipeline(config, stages: int, schedule: str) -> None:
    micro = config.micro_batches
    if schedule == "naive" and micro != 1:
        raise ValueError("the naive pipeline sends one whole batch at a time: use "
                         "micro_batches=1, or the 'naive_gpipe' / 'naive_1f1b' schedules "
                         "(hand-written too) or torch's 'gpipe' / '1f1b'")
    if schedule == "1f1b" and micro < stages:
        raise ValueError(f"1F1B needs at least as many micro-batches as stages ({stages}); "
                         f"got {micro}")
    if schedule == "interleaved_1f1b" and (micro < stages or micro % stages):
        raise ValueError(f"interleaved 1F1B sends micro-batches round the {stages} ranks in "
                         f"rounds: use a multiple of {stages} micro-batches, not {micro}")


def check_debug_env(run, debug: str | None) -> None:
    """``debug``: the run's ``TORCH_DISTRIBUTED_DEBUG`` (read by the entry point). PyTorch
    2.13's DDP over gloo dies of SIGSEGV in its first backward under ``DETAIL`` (a plain
    ``torch.multiprocessing`` DDP script does too; INFO runs), which would reach a learner
    as ranks dead of a signal: refused before any rank starts."""
    if (debug or "").upper() == "DETAIL" and run.backend == "gloo" and (
            run.engines.data_engine in ("ddp", "zero1")):
        raise ValueError(f"TORCH_DISTRIBUTED_DEBUG=DETAIL crashes PyTorch's DDP over gloo "
                         f"(SIGSEGV in the ranks' first backward, also in a plain torch "
                         f"script), which {run.label} runs: unset it, or set it to "
                         f"INFO, before starting the notebook or torchrun")
