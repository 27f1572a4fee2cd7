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
import tests.test_notebooks as test_notebooks

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
        lessons._RUNS.pop("zz_hangs", None)  # the session's real lessons stay cached
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
    env.pop(lessons.KEEP_ENV, None)  # a kept folder is the other case
    work = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True,
                          capture_output=True, text=True, timeout=300).stdout.strip()
    assert work.startswith(str(tmp_path)) and not Path(work).exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    monkeypatch.setattr(lessons, "_WORK", kept)
    monkeypatch.setattr(lessons, "_FAILED", {"00_x"})
    lessons._clean()
    assert kept.is_dir(), "a failed lesson's report names the folder: it stays"


def _executed(source: str, *outputs) -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(source)
    cell.outputs = list(outputs)
    nb.cells = [cell]
    return nb


_PNG = nbformat.v4.new_output("display_data", data={"image/png": "iVBOR", "text/plain": "<Fig>"})
_BAR = nbformat.v4.new_output("display_data", data={
    "application/vnd.jupyter.widget-view+json": {"model_id": "m"},
    "text/plain": "run:   0%|          | 0/3 [00:00<?, ?step/s]"})


def test_the_figure_check_sees_every_drawing_call():
    unshown = test_notebooks.unshown_figures
    imported = ("from labkit.lessons.long_context.plots import plot_dropped, "
                "plot_expert_load as load\n"
                "from labkit.lessons.checkpoints.kill import kill_switch\n")
    for source in (imported + "fig = plot_dropped(x)\nprint(1)",   # a name imported
                   imported + "box = kill_switch(cluster, config)\nprint(1)",
                   imported + "load(x), 1",                        # an alias
                   "fig = plt.figure()\nplt.plot([1, 2])\nplt.close(fig)",
                   "labkit.lessons.layouts.plots.plot_rank_grid(layout)\nprint(1)"):
        assert unshown(_executed(source)), source
        assert not unshown(_executed(source, _PNG)), source
    assert unshown(_executed("labkit.plots.plot_losses(runs)\nprint(1)", _BAR)), \
        "a progress bar is not the figure"


def test_the_figure_check_ignores_what_does_not_draw():
    unshown = test_notebooks.unshown_figures
    for source in ("# labkit.plots.plot_losses(runs) would show the losses\nprint(runs)",
                   'print("call labkit.plots.plot_losses(runs) to see them")',
                   "from labkit.lessons.layouts.plots import wire_bytes_by_dim\n"
                   "table = wire_bytes_by_dim(layout)\nresult = table",
                   "labkit.widgets.show_source(labkit.train)"):
        assert not unshown(_executed(source)), source


def test_a_warning_in_any_case_reaches_the_check():
    for text in ("/x.py:3: UserWarning: careful\n", "WARNING:root:ranks share cores\n",
                 "[W1201 12:00:00 ProcessGroupGloo.cpp:1] Warning: slow\n"):
        nb = _executed("run()", nbformat.v4.new_output("stream", name="stderr", text=text))
        assert test_notebooks.warnings_shown(nb), text
    quiet = _executed("run()", nbformat.v4.new_output("stream", name="stderr", text="12%\n"))
    assert not test_notebooks.warnings_shown(quiet)


def test_a_forked_process_leaves_the_sessions_folder(tmp_path, monkeypatch):
    """A rank forked from the test process inherits the atexit hook: only the process that
    made the folder removes it."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setattr(lessons, "_WORK", work)
    monkeypatch.setattr(lessons, "_OWNER", os.getpid())
    monkeypatch.setattr(lessons, "_FAILED", set())
    child = os.fork()
    if child == 0:
        lessons._clean()
        os._exit(0)
    os.waitpid(child, 0)
    assert work.is_dir()


def test_the_hung_lesson_test_keeps_the_sessions_other_lessons(tmp_path, monkeypatch):
    monkeypatch.setitem(lessons._RUNS, "00_kept", "a cached outcome")
    test_a_lesson_past_its_cell_time_runs_once_and_is_reported(tmp_path, monkeypatch)
    assert lessons._execute("00_kept") == "a cached outcome"  # not run again
