"""Before any rank starts: can this run be checkpointed, and where will it resume from."""

from __future__ import annotations

from labkit.checkpoint.store import CheckpointError, Found, check_dir


def check_checkpointing(config, layout) -> Found | None:
    """``CheckpointError`` when ``config.checkpoint_dir`` is set for a layout labkit cannot
    checkpoint yet, or holds only another run's checkpoints; else the checkpoint the run
    will resume from (None: from the start). Warns for each checkpoint passed over."""
    if config.checkpoint_dir is None:
        return None
    if layout.pipelined or layout.tables is not None or layout.data_engine == "zero1":
        what = ("a pipeline (its stages' names differ from the model's)" if layout.pipelined
                else "embedding tables placed by labkit's planner" if layout.tables
                else "ZeRO-1 (ZeroRedundancyOptimizer has no sharded state dict)")
        raise CheckpointError(f"checkpoints are not supported yet for {layout} with {what}: "
                              f"use ddp, naive_dp, fsdp, tp or a layout of dp, fsdp and tp, "
                              f"or drop checkpoint_dir")
    return check_dir(config.checkpoint_dir, config.to_dict(), config.steps)
