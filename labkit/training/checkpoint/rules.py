"""Before any rank starts: can this run be checkpointed, and where will it resume from."""

from __future__ import annotations

import os
from pathlib import Path

from labkit.runtime.folders import check_can_be_a_folder
from labkit.training.checkpoint.store import CheckpointError, Found, check_dir


def check_checkpointing(run) -> Found | None:
    """``CheckpointError`` when ``run.config.checkpoint_dir`` (``run``: a resolved Run)
    cannot be made or holds only another run's checkpoints; else the checkpoint the run will
    resume from (None: from the start). Warns for each checkpoint passed over. Every layout
    checkpoints. What is on disk, looked at before any rank starts: the config itself was
    checked when the run was resolved."""
    config = run.config
    if config.checkpoint_dir is None:
        return None
    check_can_be_a_folder(Path(config.checkpoint_dir), "checkpoint_dir", CheckpointError)
    return check_dir(config.checkpoint_dir, config.to_dict(), config.steps)


def resolved(config):
    """``config`` with ``checkpoint_dir`` as ``labkit.train`` hands it to the ranks: ``~``
    expanded, absolute from this process's working folder. A run started any other way (a
    planted failure, the kill button) must save where ``train`` will resume from."""
    if config.checkpoint_dir is None:
        return config
    return config.replace(
        checkpoint_dir=os.path.abspath(os.path.expanduser(config.checkpoint_dir)))
