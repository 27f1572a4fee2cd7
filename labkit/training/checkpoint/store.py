"""A run's checkpoints on disk, and which of them can be trusted (no torch.distributed here).

    checkpoint_dir/
        step-00000004/               a complete checkpoint: 4 steps done
            __0_0.distcp ...         DCP's files, one per rank (``FileSystemWriter``)
            .metadata                DCP's index of every tensor's shards
            records-0.json ...       each rank's step records so far
            COMPLETE.json            written last: the run's fingerprint, the step, each
                                     file's size
        step-00000008.tmp/           a save under way (or killed): never read

A save writes into ``step-N.tmp``, writes ``COMPLETE.json`` last, then renames the folder
to ``step-N`` (a rename is atomic on one file system): a crash at any moment leaves either
no ``step-N`` or a complete one. A folder without its marker, with a file missing or of
another size than the marker says (a truncated shard, a rank's shard lost), or saved by
another run (another model, batch, optimizer, seed...) is passed over, saying why, and the
newest good one is used.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from dataclasses import dataclass
from pathlib import Path

MARKER = "COMPLETE.json"
# 2: the optimizer state flattened, one key per parameter (``state.py``), which every layout
# can read; labkit's first checkpoints (1, no "format" in the marker) nested it per group.
FORMAT = 2
_NAME = re.compile(r"^step-(\d{8})$")

# Fields that may change between a run and its resumption: how the run is laid out (DCP
# reshards over another layout or rank count), how long it goes on, what it returns.
_FREE_FIELDS = ("strategy", "layout", "schedule", "dp_kind", "tables", "tp_kind", "steps",
                "return_weights", "bucket_cap_mb", "profile",
                "checkpoint_dir", "checkpoint_every", "checkpoint_async", "checkpoint_keep")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used, or a checkpoint directory that holds no usable one
    for this run; the message says which and what to change."""


class CheckpointWarning(UserWarning):
    """A checkpoint was passed over (incomplete, damaged, or of another run)."""


def fingerprint(config_dict: dict) -> dict:
    """What makes two runs the same run: a ``TrainConfig.to_dict()`` without the fields
    that may change on resumption."""
    return {k: v for k, v in config_dict.items() if k not in _FREE_FIELDS}


def records_file(rank: int) -> str:
    return f"records-{rank}.json"


def step_dir(root, step: int) -> Path:
    return Path(root) / f"step-{step:08d}"


def tmp_dir(root, step: int) -> Path:
    return Path(root) / f"step-{step:08d}.tmp"


@dataclass(frozen=True)
class Found:
    """A complete checkpoint of this run: its folder, the steps done, and its marker."""

    path: Path
    step: int
    marker: dict


def _problem(path: Path, want: dict) -> str | None:
    """Why the checkpoint in ``path`` cannot be used by a run with fingerprint ``want``, or
    None when it can."""
    try:
        marker = json.loads((path / MARKER).read_text())
    except FileNotFoundError:
        return f"{path.name} has no {MARKER}: its save never finished"
    except (OSError, ValueError) as exc:
        return f"{path.name}/{MARKER} cannot be read ({exc})"
    for name, size in marker.get("files", {}).items():
        file = path / name
        if not file.is_file():
            return f"{path.name}/{name} is missing (a rank's shard lost?)"
        if file.stat().st_size != size:
            return (f"{path.name}/{name} holds {file.stat().st_size} bytes, {size} were "
                    f"written (truncated or damaged)")
    if marker.get("format", 1) != FORMAT:
        return (f"{path.name} is of an older labkit (checkpoint format "
                f"{marker.get('format', 1)}, this labkit reads {FORMAT})")
    if marker.get("fingerprint") != want:
        return f"{path.name} is another run's: {_difference(marker.get('fingerprint'), want)}"
    return None


def _difference(saved, want: dict) -> str:
    if not isinstance(saved, dict):
        return "it names no run"
    keys = sorted(set(saved) | set(want), key=str)
    diff = [f"{k}={saved.get(k)!r} there, {want.get(k)!r} here" for k in keys
            if saved.get(k) != want.get(k)]
    return "; ".join(diff)


def scan(root, config_dict: dict, max_step: int | None = None
         ) -> tuple[list[Found], list[str]]:
    """The usable checkpoints of this run in ``root``, newest first, and why each other one
    was passed over. Those past ``max_step`` steps are left out silently (a shorter run)."""
    root = Path(root)
    want = fingerprint(config_dict)
    found, problems = [], []
    if not root.is_dir():
        return found, problems
    for path in sorted(root.iterdir(), reverse=True):
        match = _NAME.match(path.name)
        if not match or not path.is_dir():
            continue
        step = int(match.group(1))
        if max_step is not None and step > max_step:
            continue
        problem = _problem(path, want)
        if problem is None:
            found.append(Found(path, step, json.loads((path / MARKER).read_text())))
        else:
            problems.append(problem)
    return found, problems


def check_dir(root, config_dict: dict, max_step: int | None = None) -> Found | None:
    """Before any rank starts: the checkpoint a run will resume from (None: it starts
    afresh). Warns for each one passed over; raises ``CheckpointError`` when ``root`` holds
    checkpoints but none of this run (resuming someone else's run by mistake, or starting
    over in their folder, are both better refused)."""
    found, problems = scan(root, config_dict, max_step)
    for problem in problems:
        if found or "another run's" not in problem:
            warnings.warn(f"checkpoint passed over: {problem}", CheckpointWarning,
                          stacklevel=3)
    others = [p for p in problems if "another run's" in p]
    if not found and others:
        raise CheckpointError(f"checkpoint_dir {str(root)!r} holds checkpoints of another "
                              f"run ({others[0]}): give this run a directory of its own, "
                              f"or delete those")
    older = [p for p in problems if "older labkit" in p]
    if not found and older:  # starting over would bury them: say so instead
        raise CheckpointError(f"checkpoint_dir {str(root)!r} holds only checkpoints this "
                              f"labkit cannot resume ({older[0]}): resume them with the "
                              f"labkit that saved them, or delete them to start afresh")
    return found[0] if found else None


def write_json(path: Path, data) -> None:
    """Write ``data`` to ``path`` whole or not at all (a temporary file, synced, renamed)."""
    part = path.with_name(path.name + ".part")
    with open(part, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(part, path)


def commit(tmp: Path, final: Path, step: int, config_dict: dict, world_size: int,
           layout: str) -> None:
    """Rank 0, after every rank's shard and records are written: the marker (the file
    sizes as they are now), then the rename that makes the checkpoint visible."""
    files = {f.name: f.stat().st_size for f in tmp.iterdir() if f.is_file()}
    write_json(tmp / MARKER, {"step": step, "format": FORMAT,
                              "fingerprint": fingerprint(config_dict),
                              "world_size": world_size, "layout": layout, "files": files})
    if final.exists():  # a damaged checkpoint of this step, passed over at resumption:
        shutil.rmtree(final)  # until the rename the newest good one is an earlier step
    os.replace(tmp, final)
    fd = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself reaches the disk
    finally:
        os.close(fd)


_TMP = re.compile(r"^step-(\d{8})\.tmp$")


def prune(root, config_dict: dict, step: int, keep: int | None) -> list[str]:
    """Rank 0, right after step ``step`` was committed: delete what can no longer be needed,
    and return the folders' names. Saves of earlier steps left unfinished (``step-N.tmp``
    with N < ``step``: a run killed mid-save; saves run one after another, so none of them is
    still being written), and with ``keep``, this run's complete checkpoints older than its
    newest ``keep`` (another run's, damaged ones and later steps are never touched)."""
    root = Path(root)
    gone = []
    for path in sorted(root.iterdir()):
        match = _TMP.match(path.name)
        if match and path.is_dir() and int(match.group(1)) < step:
            shutil.rmtree(path, ignore_errors=True)
            gone.append(path.name)
    if keep is not None:
        found, _ = scan(root, config_dict, max_step=step)  # newest first, this run's only
        for old in found[keep:]:
            shutil.rmtree(old.path, ignore_errors=True)
            gone.append(old.path.name)
    return gone
