"""The rules a run must pass before any process starts: the layout fits the ranks, the model
and the batch. Each error says what to change."""

from __future__ import annotations

from labkit.models import plan_for
from labkit.parallel.context.engine import resolve_engine
from labkit.training.layout.layout import Layout


def check_run(config, layout: Layout, world_size: int, device: str = "cpu",
              backend: str = "gloo") -> None:
    """Raise ValueError if ``config`` (a TrainConfig) cannot train with ``layout`` on
    ``world_size`` ranks of ``device`` talking over ``backend``."""
    if layout.size != world_size:
        raise ValueError(f"the layout {layout} needs {layout.size} ranks and the cluster has "
                         f"{world_size}: resize the cluster (cluster.resize({layout.size})) or "
                         f"choose degrees whose product is {world_size}")
    _check_batch(config, layout)
    plan = plan_for(config.model)
    _check_levers(config, layout, plan)
    plan.check_tp(config.model, layout.tp)
    if layout.cp > 1:
        _check_cp(config, layout, plan)
        resolve_engine(config.cp_engine, device)  # "torch" on CPU ranks is refused here
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
    if layout.pipelined:  # the model first: no micro-batch count makes it a chain
        plan.check_pipeline(config.model, layout.pp * layout.stages_per_rank)
        _check_pipeline(config, layout)
        if device == "cuda" and backend != "nccl":
            raise ValueError("a pipeline on GPUs that ranks share talks over gloo, and gloo "
                             "cannot send GPU tensors point to point: give each rank its own "
                             "GPU (as many ranks as GPUs), or use device='cpu'")
    if layout.tables is not None:
        plan.check_tables(config.model, layout.tables, layout.fsdp)


def _check_cp(config, layout: Layout, plan) -> None:
    """Context parallelism: a model with attention, sequences that cut into 2 x cp chunks,
    and the dimensions it has been built and tested with (dp, fsdp)."""
    plan.check_cp(config.model, layout.cp)
    if layout.tp > 1 or layout.pipelined:
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


def _check_levers(config, layout: Layout, plan) -> None:
    """The memory levers (precision, gradient accumulation, activation checkpointing)."""
    if config.activation_checkpointing:
        plan.check_checkpointing(config.model)
    if layout.pipelined and config.grad_accumulation > 1:
        raise ValueError("a pipeline already accumulates gradients over its micro-batches: "
                         f"set micro_batches={config.micro_batches * config.grad_accumulation}"
                         " and grad_accumulation=1")
    if layout.pipelined and config.precision != "fp32":
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


def _check_pipeline(config, layout: Layout) -> None:
    micro, stages, schedule = config.micro_batches, layout.pp, layout.pipeline_schedule
    if schedule == "naive" and micro != 1:
        raise ValueError("the naive pipeline sends one whole batch at a time: use "
                         "micro_batches=1, or the 'gpipe' / '1f1b' schedules")
    if schedule == "1f1b" and micro < stages:
        raise ValueError(f"1F1B needs at least as many micro-batches as stages ({stages}); "
                         f"got {micro}")
    if schedule == "interleaved_1f1b" and (micro < stages or micro % stages):
        raise ValueError(f"interleaved 1F1B sends micro-batches round the {stages} ranks in "
                         f"rounds: use a multiple of {stages} micro-batches, not {micro}")


def check_debug_env(layout: Layout, backend: str, debug: str | None) -> None:
    """``debug``: the run's ``TORCH_DISTRIBUTED_DEBUG`` (read by the entry point). PyTorch
    2.13's DDP over gloo dies of SIGSEGV in its first backward under ``DETAIL`` (a plain
    ``torch.multiprocessing`` DDP script does too; INFO runs), which would reach a learner
    as ranks dead of a signal: refused before any rank starts."""
    if (debug or "").upper() == "DETAIL" and backend == "gloo" and layout.data_engine in (
            "ddp", "zero1"):
        raise ValueError(f"TORCH_DISTRIBUTED_DEBUG=DETAIL crashes PyTorch's DDP over gloo "
                         f"(SIGSEGV in the ranks' first backward, also in a plain torch "
                         f"script), which the layout {layout} runs: unset it, or set it to "
                         f"INFO, before starting the notebook or torchrun")
