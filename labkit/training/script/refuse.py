"""What a written script leaves to labkit: each refused run, with the reason and what to
run instead. Checked before a line is written."""

from __future__ import annotations

from labkit.training.engines import SAME_ORDER


class ScriptRefused(ValueError):
    """labkit trains this run, but no standalone script is written for it (the message says
    why, and what to change)."""


def refusal(run) -> str | None:
    """Why ``run`` (resolved) gets no script, or None when it gets one."""
    config, layout, engines = run.config, run.layout, run.engines
    family = config.model.name
    if family == "dlrm" or engines.tables is not None:
        return ("the DLRM's embedding tables are placed by labkit's planner and their "
                "gradients averaged by hand (labkit/parallel/embedding), which is no torch "
                "API: scripts are written for the zoo's 'mlp' and 'gpt'")
    if family == "moe_gpt" or layout.ep > 1:
        return ("the MoE GPT's experts reach their tokens by labkit's hand-written all-to-all "
                "(labkit/parallel/expert), which is no torch API: scripts are written for "
                "the zoo's 'mlp' and 'gpt'")
    if layout.cp > 1:
        return (f"cp={layout.cp}: on CPU ranks labkit runs its hand-written ring attention "
                "(labkit/parallel/context), and PyTorch's context_parallel runs on CUDA only, "
                "so no torch-only script gives labkit's losses on both: use cp=1")
    if engines.schedule in SAME_ORDER:
        return (f"the {engines.schedule!r} schedule is labkit's hand-written pipeline, for "
                f"reading (labkit/parallel/pipeline/naive.py): choose "
                f"schedule={engines.schedule_order!r}, which torch.distributed.pipelining runs "
                f"in the same order")
    if engines.tp_kind == "naive":
        return ("tp_kind='naive' trains with labkit's hand-written Megatron layers, for "
                "reading (labkit/parallel/tensor/layers.py), which are no torch API: choose "
                "tp_kind='dtensor', which parallelize_module runs with the same plan and "
                "the same losses")
    if config.checkpoint_dir is not None:
        return ("a script trains from its first step to its last and saves no checkpoint: "
                "leave out checkpoint_dir (--checkpoint-dir); lesson 10 shows "
                "torch.distributed.checkpoint")
    return None


def check_scriptable(run) -> None:
    reason = refusal(run)
    if reason is not None:
        raise ScriptRefused(f"no script for {run.label} x{run.world_size}: {reason}")
