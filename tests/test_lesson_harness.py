"""The lesson harness itself (tests/lessons.py, tests/test_notebooks.py), on tiny notebooks:
a lesson that stops is run once and reported readably; the session's folder of executed
lessons does not outlive it; the figure check sees every drawing call."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat

import tests.lessons as lessons

REPO = Path(__file__).resolve().parent.parent


def _notebook(path: Path, *sources: str) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_code_cell(source) for source in sources]
    nbformat.write(nb, path)


def test_a_lesson_past_its_cell_time_runs_once_and_is_reported(tmp_path, monkeypatch):
    runs = tmp_path / "runs"
    _notebook(tmp_path / "zz_hangs.ipynb", f"open({str(runs)!r}, 'a').write('x')",
              "import time\ntime.sleep(60)")
    monkeypatch.setattr(lessons, "COURSE", tmp_path)
    monkeypatch.setattr(lessons, "CELL_TIMEOUT_S", 3)
    try:
        first = lessons._execute("zz_hangs")
        again = lessons._execute("zz_hangs")  # every test of the lesson asks
    finally:
        lessons._execute.cache_clear()
        lessons._FAILED.discard("zz_hangs")
    assert isinstance(first, str) and "zz_hangs did not finish" in first, first
    assert "CellTimeoutError" in first and "time.sleep(60)" in first
    assert again == first and runs.read_text() == "x"  # executed once


def test_the_executed_lessons_folder_goes_at_exit_unless_a_lesson_failed(tmp_path,
                                                                         monkeypatch):
    code = ("import pathlib, tempfile\nimport tests.lessons as L\n"  # as test_browser does
            "assert not list(pathlib.Path(tempfile.gettempdir()).glob('labkit-lessons-*'))\n"
            "w = L._work()\n(w / 'a.ipynb').write_text('{}')\nprint(w)")
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(REPO))
    work = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                          capture_output=True, text=True, timeout=300).stdout.strip()
    assert work.startswith(str(tmp_path)) and not Path(work).exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    monkeypatch.setattr(lessons, "_WORK", kept)
    monkeypatch.setattr(lessons, "_FAILED", {"00_x"})
    lessons._clean()
    assert kept.is_dir(), "a failed lesson's report names the folder: it stays"
