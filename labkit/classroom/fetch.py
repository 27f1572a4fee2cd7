"""Copy the learners' notebooks out of the installed package into a folder of the learner's,
as ``nbgrader fetch`` does:

    python -m labkit notebooks ~/labkit-lessons        # then: jupyter lab ~/labkit-lessons

It writes the lessons' notebooks, the Voila apps (``apps/``) and the quizzes (``quizzes/``);
reveal reads the reference solutions from the package. Each fetch records in the folder's
``.labkit-notebooks.json`` (the manifest) the sha256 of every file it copied there, with
labkit's version. A later fetch (after an upgrade) leaves a file that matches the package's
copy as it is, replaces one whose content is still what it copied (the learner has not
edited it) with the package's copy, and keeps and names one that differs from both, or that
the manifest does not know: that is the learner's work, overwritten only with ``force``.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from labkit import __version__
from labkit.lessons.materials import SOLUTIONS, learners_notebooks, material_files

MANIFEST = ".labkit-notebooks.json"  # in the learner's folder: what fetch copied there


class FetchError(ValueError):
    """A folder the notebooks cannot be copied into."""


@dataclass
class Fetched:
    """What ``fetch`` did, each a path under the destination."""

    folder: Path
    written: list[Path] = field(default_factory=list)  # new here
    unchanged: list[Path] = field(default_factory=list)  # already the package's copy
    updated: list[Path] = field(default_factory=list)  # as fetch copied it: now the package's
    kept: list[Path] = field(default_factory=list)  # the learner's edits: not replaced
    replaced: list[Path] = field(default_factory=list)  # the learner's, overwritten by ``force``
    manifest_problem: str = ""  # why the manifest could not be read, if it could not


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _destination(folder: Path) -> Path:
    folder = Path(folder).expanduser()
    if folder.exists() and not folder.is_dir():
        raise FetchError(f"{folder} is a file, not a folder: name a folder to copy the "
                         "notebooks into (it is made if missing)")
    own = Path(str(learners_notebooks())).resolve()
    if folder.resolve().is_relative_to(own):
        raise FetchError(f"{folder} is the suite's own copy of the notebooks, or inside it: "
                         "name another folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise FetchError(f"cannot make the folder {folder}: {error.strerror or error}") from None
    return folder


def read_manifest(folder: Path) -> tuple[dict[str, str], str]:
    """The sha256 of each file the last fetch copied into ``folder``, by its path there, and
    why the manifest could not be read ("" when it could, or when there is none)."""
    path = folder / MANIFEST
    if not path.exists():
        return {}, ""
    try:
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        if not isinstance(files, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in files.items()):
            raise TypeError("files is not a table of paths to hashes")
        return files, ""
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError) as error:
        return {}, f"{path}: {error}"


def write_manifest(folder: Path, files: dict[str, str]) -> None:
    """Write ``folder``'s manifest whole or not at all (a temporary file, then a rename), so
    an interrupted fetch never leaves a half-written one."""
    text = json.dumps({"labkit": __version__, "files": dict(sorted(files.items()))}, indent=1)
    handle, temporary = tempfile.mkstemp(prefix=f"{MANIFEST}.", dir=folder)
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(text + "\n")
        os.replace(temporary, folder / MANIFEST)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _place(result: Fetched, target: Path, data: bytes, copied: str | None,
           force: bool) -> bool:
    """Sort ``target`` into ``result``; True if it is to be (over)written with ``data``.
    ``copied``: the sha256 the manifest has for it (None: no entry)."""
    if not target.is_file():
        result.written.append(target)
        return True
    mine = target.read_bytes()
    if mine == data:
        result.unchanged.append(target)
    elif copied is not None and _sha256(mine) == copied:
        result.updated.append(target)
        return True
    elif force:
        result.replaced.append(target)
        return True
    else:
        result.kept.append(target)
    return False


def fetch(folder: Path, force: bool = False) -> Fetched:
    """Copy the learners' materials into ``folder`` (made if missing) and record them in its
    manifest. A file there that the learner edited is kept (``force``: overwritten); one
    they did not is brought up to the package's copy. Raises ``FetchError`` for a folder
    that cannot take them."""
    materials = material_files()
    if not materials:
        raise FetchError(f"the package holds no notebooks ({learners_notebooks()} has none): "
                         "in a checkout, labkit/notebooks is a symbolic link to notebooks/ "
                         "(clone with symbolic links: git config core.symlinks true)")
    result = Fetched(_destination(folder))
    before, result.manifest_problem = read_manifest(result.folder)
    after: dict[str, str] = {}
    for name, source in materials:
        if name.startswith(f"{SOLUTIONS}/"):
            continue  # reveal reads the package's own solutions
        data, target = source.read_bytes(), result.folder / name
        try:
            if _place(result, target, data, before.get(name), force):
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
        except OSError as error:
            raise FetchError(f"cannot write {target}: {error.strerror or error}") from None
        if target in result.kept:
            if name in before:
                after[name] = before[name]  # still what fetch copied, should the edits go
        else:
            after[name] = _sha256(data)
    try:
        write_manifest(result.folder, after)
    except OSError as error:
        raise FetchError(f"cannot write {result.folder / MANIFEST}: "
                         f"{error.strerror or error}") from None
    return result


def report(result: Fetched) -> list[str]:
    """The lines ``python -m labkit notebooks`` prints for ``result``."""
    lines = []
    if result.manifest_problem:
        lines.append(f"cannot read the record of what was copied here ({result.manifest_problem}"
                     "): every file that differs from the suite's copy is kept as yours")
    lines += [f"wrote {path}" for path in result.written]
    lines += [f"updated {path} to the suite's copy (you had not edited it)"
              for path in result.updated]
    lines += [f"replaced {path} (--force)" for path in result.replaced]
    lines += [f"kept {path}: it differs from the suite's copy and from the copy labkit made "
              "here, so it holds your edits (they are kept; --force replaces it)"
              for path in result.kept]
    done = len(result.written) + len(result.updated) + len(result.replaced)
    summary = f"{done} file(s) written to {result.folder}"
    if result.updated:
        summary += f" ({len(result.updated)} updated)"
    if result.unchanged:
        summary += f", {len(result.unchanged)} already up to date"
    if result.kept:
        summary += f", {len(result.kept)} of yours kept"
    return [*lines, summary, f"next: jupyter lab {result.folder}"]
