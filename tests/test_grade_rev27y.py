"""A second hostile review of the grader (rev27y): the package's reference solutions are still
readable in the sandbox where the installed labkit is not the only copy the sandbox shows.

1. A Python prefix reached through a symbolic link (a venv under a linked home or ``/tmp``,
   ``current -> release-3``): the sandbox binds the prefix at its linked path, while
   ``_hidden_materials`` covers the *resolved* path, which the sandbox does not show.
   End to end: ``ln -s venv alias; alias/bin/python -m labkit grade`` of a notebook 00 whose
   answer reads ``<sys.path entry>/labkit/notebooks/solutions/00_your_cluster.json`` and
   execs it earns 3/3.
2. Another installed copy of labkit under a prefix the sandbox binds but not on ``sys.path``
   (an older ``pip install`` into the base Python, or ``/usr/local``): never covered.

Only code that reads files runs, and only inside the sandbox.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest

from labkit.classroom import sandbox

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no sandbox here: {sandbox.problem()}")
SOLUTION = "notebooks/solutions/00_your_cluster.json"


def _wheel_layout(site: Path) -> Path:
    package = site / "labkit"
    shutil.copytree(REPO / "labkit", package, symlinks=False,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert (package / SOLUTION).is_file()
    return package


def _read_in_sandbox(path: Path, job: Path) -> subprocess.CompletedProcess:
    argv = sandbox.command([sys.executable, "-c", f"print(open({str(path)!r}).read()[:40])"],
                           job, sandbox.Limits())
    return subprocess.run(argv, capture_output=True, text=True, timeout=60)


def test_a_prefix_behind_a_link_never_shows_the_solutions(tmp_path, monkeypatch):
    _wheel_layout(tmp_path / "real" / "prefix" / "site-packages")
    (tmp_path / "alias").symlink_to(tmp_path / "real")
    prefix = tmp_path / "alias" / "prefix"  # what sys.prefix is: a venv's path is not resolved
    site = prefix / "site-packages"
    monkeypatch.setattr(sandbox, "labkit", types.SimpleNamespace(
        __file__=str(site / "labkit" / "__init__.py")))
    prefixes = sandbox._python_paths() + [str(prefix)]
    monkeypatch.setattr(sandbox, "_python_paths", lambda: prefixes)
    monkeypatch.setattr(sys, "path", sys.path + [str(site)])
    (tmp_path / "job").mkdir()
    result = _read_in_sandbox(site / "labkit" / SOLUTION, tmp_path / "job")
    assert "FileNotFoundError" in result.stderr, ("readable", result.stdout)


def test_another_copy_under_a_bound_prefix_never_shows_the_solutions(tmp_path, monkeypatch):
    site = tmp_path / "base" / "lib" / "python3" / "site-packages"  # not on sys.path
    package = _wheel_layout(site)
    prefixes = sandbox._python_paths() + [str(tmp_path / "base")]
    monkeypatch.setattr(sandbox, "_python_paths", lambda: prefixes)
    (tmp_path / "job").mkdir()
    result = _read_in_sandbox(package / SOLUTION, tmp_path / "job")
    assert "FileNotFoundError" in result.stderr, ("readable", result.stdout)
