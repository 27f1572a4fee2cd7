"""The learners' materials that ship inside the package: the lessons' notebooks, the Voila
apps, the quizzes and the reference solutions, as ``python -m labkit release`` writes them.

They are package data, read with ``importlib.resources`` (``labkit/notebooks`` in an
installed wheel; in a checkout, and so in an editable install, ``labkit/notebooks`` is a
link to the repository's ``notebooks/``). ``python -m labkit notebooks DIR`` copies them
out for a learner to open and edit.
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from importlib.abc import Traversable

FOLDER = "notebooks"
QUIZZES = "quizzes"
SOLUTIONS = "solutions"
APPS = "apps"
SUFFIXES = {"": ".ipynb", APPS: ".ipynb", QUIZZES: ".json", SOLUTIONS: (".json", ".txt")}


def learners_notebooks() -> Traversable:
    """The folder of the learners' notebooks in the installed package."""
    return files("labkit") / FOLDER


def quiz_file(name: str) -> Traversable:
    """The package's quiz ``name`` (a notebook's stem, e.g. "00_your_cluster")."""
    return learners_notebooks() / QUIZZES / f"{name}.json"


def quizzes_folder() -> Path:
    """The package's quizzes as a folder on disk (pip installs a wheel's files unzipped), for
    the grader, which copies it into each sandbox."""
    return Path(str(learners_notebooks() / QUIZZES))


def solutions_folder() -> Traversable:
    """The package's reference solutions, one ``<notebook>.json`` each (or ``NONE.txt``)."""
    return learners_notebooks() / SOLUTIONS


def material_files() -> list[tuple[str, Traversable]]:
    """Every shipped file as (its path under the folder, posix style; the file), sorted:
    the notebooks, then ``apps/``, ``quizzes/`` and ``solutions/``."""
    found = []
    for sub, suffix in SUFFIXES.items():
        folder = learners_notebooks() / sub if sub else learners_notebooks()
        if not folder.is_dir():
            continue
        for item in folder.iterdir():
            if item.is_file() and item.name.endswith(suffix):
                found.append((f"{sub}/{item.name}" if sub else item.name, item))
    return sorted(found, key=lambda pair: (pair[0].count("/"), pair[0]))
