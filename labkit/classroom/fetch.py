"""Copy the learners' notebooks out of the installed package into a folder of the learner's,
as ``nbgrader fetch`` does:

    python -m labkit notebooks ~/labkit-lessons        # then: jupyter lab ~/labkit-lessons

It writes the lessons' notebooks, the Voila apps (``apps/``) and the quizzes (``quizzes/``);
reveal reads the reference solutions from the package. A file already there that differs from
the package's copy is the learner's work: it is kept and named, unless ``force``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from labkit.lessons.materials import SOLUTIONS, learners_notebooks, material_files


class FetchError(ValueError):
    """A folder the notebooks cannot be copied into."""


@dataclass
class Fetched:
    """What ``fetch`` did, each a path under the destination."""

    folder: Path
    written: list[Path] = field(default_factory=list)
    unchanged: list[Path] = field(default_factory=list)
    kept: list[Path] = field(default_factory=list)  # differ from the package's: not replaced
    replaced: list[Path] = field(default_factory=list)  # differed, overwritten by ``force``


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


def fetch(folder: Path, force: bool = False) -> Fetched:
    """Copy the learners' materials into ``folder`` (made if missing). A file there that
    differs from the package's is kept (``force``: overwritten). Raises ``FetchError`` for a
    folder that cannot take them."""
    materials = material_files()
    if not materials:
        raise FetchError(f"the package holds no notebooks ({learners_notebooks()} has none): "
                         "in a checkout, labkit/notebooks is a symbolic link to notebooks/ "
                         "(clone with symbolic links: git config core.symlinks true)")
    result = Fetched(_destination(folder))
    for name, source in materials:
        if name.startswith(f"{SOLUTIONS}/"):
            continue  # reveal reads the package's own solutions
        data, target = source.read_bytes(), result.folder / name
        if target.is_file():
            if target.read_bytes() == data:
                result.unchanged.append(target)
                continue
            if not force:
                result.kept.append(target)
                continue
            result.replaced.append(target)
        else:
            result.written.append(target)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        except OSError as error:
            raise FetchError(f"cannot write {target}: {error.strerror or error}") from None
    return result


def report(result: Fetched) -> list[str]:
    """The lines ``python -m labkit notebooks`` prints for ``result``."""
    lines = [f"wrote {path}" for path in result.written]
    lines += [f"replaced {path} (--force)" for path in result.replaced]
    lines += [f"kept {path}: it differs from the suite's copy (your edits are kept; --force "
              "replaces it)" for path in result.kept]
    done = len(result.written) + len(result.replaced)
    summary = f"{done} file(s) written to {result.folder}"
    if result.unchanged:
        summary += f", {len(result.unchanged)} already up to date"
    if result.kept:
        summary += f", {len(result.kept)} of yours kept"
    return [*lines, summary, f"next: jupyter lab {result.folder}"]
