"""A folder a run will write into (checkpoints, traces), checked before any rank starts."""

from __future__ import annotations

import os
from pathlib import Path


def check_can_be_a_folder(root: Path, name: str, error: type[Exception] = ValueError) -> None:
    """Raise ``error`` now for what would stop a rank from making or writing ``root`` later,
    after it trained: a file in its place or in a parent's, a folder nobody may write in.
    ``name`` is the option the learner gave it as ("checkpoint_dir", "profile folder")."""
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise error(f"{name} {str(root)!r} cannot be made: {str(existing)!r} is a file, not "
                    f"a folder: give another {name}")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise error(f"{name} {str(root)!r}: {str(existing)!r} cannot be written to: give a "
                    f"folder you may write in")
