"""labkit as a learner installs it: the wheel, in a fresh virtual environment outside the
repository (no PYTHONPATH, another working folder), runs ``doctor``, copies the notebooks out
with ``python -m labkit notebooks DIR`` and runs one of them there under papermill; and an
editable install finds the same materials in the checkout. The fresh environment gets the
wheel's own dependencies and papermill and ipykernel, not all of ``[lab]`` (JupyterLab and
Voila would triple the install's time and are not used here; requirements.txt installs them).

The wheel is built from a copy of what it is made of (pyproject.toml, README.md, LICENSE,
labkit/ and notebooks/), so a stale ``build/`` in the checkout cannot leak into it. pip runs
with ``--no-compile`` (byte-compiling all of torch costs more than this test's run: Python
compiles what is imported, once) and takes torch and the rest from its usual places
(``torch==2.13.0`` from the local file where there is one).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import time
import venv
from pathlib import Path

import pytest

from tests.lessons import SMOKE

REPO = Path(__file__).resolve().parent.parent
MADE_OF = ["pyproject.toml", "README.md", "LICENSE", "labkit", "notebooks"]
LESSON = "00_your_cluster"
INSTALL_S = 900


def _clean_env(**extra) -> dict:
    """This process's environment without what would point Python at the checkout, and with
    Python writing its bytecode caches as it does by default (pip installed none, so the first
    process that imports torch writes them and the others reuse them)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "JUPYTER_PATH",
                        "PYTHONDONTWRITEBYTECODE")}
    return {**env, **extra}


def _run(args, cwd: Path, timeout: float, **env) -> subprocess.CompletedProcess:
    result = subprocess.run([str(a) for a in args], cwd=cwd, env=_clean_env(**env),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def _source_copy(where: Path) -> Path:
    source = where / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", ".ipynb_checkpoints")
    for name in MADE_OF:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, source / name, symlinks=True, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    return source


def _pip(*args) -> list:
    """This environment's pip (the test suite's), told which Python to install into."""
    return [sys.executable, "-m", "pip", *args]


def _fresh_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=False).create(path)  # pip comes from outside: --python
    return path / "bin" / "python"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh environment's python, its working folder, seconds each step took)."""
    root = tmp_path_factory.mktemp("package")
    source, wheels, times = _source_copy(root), root / "wheels", {}
    start = time.perf_counter()
    _run(_pip("wheel", "-q", "--no-deps", "--no-build-isolation", "-w", wheels, source),
         root, 300)
    times["build the wheel"] = time.perf_counter() - start
    (wheel,) = wheels.glob("labkit_course-*.whl")
    python = _fresh_venv(root / "env")
    start = time.perf_counter()
    # the wheel with what a kernel needs to run the lessons (as on Colab), and the two of its
    # [lab] extra that run a notebook headless; requirements.txt installs all of [lab]
    _run(_pip("--python", python, "install", "-q", "--no-compile", wheel, "papermill",
              "ipykernel"), root, INSTALL_S)
    times["install the wheel, papermill, ipykernel"] = time.perf_counter() - start
    work = root / "work"
    work.mkdir()
    return python, work, times


@pytest.mark.timeout(INSTALL_S + 600)  # the first one builds and installs
def test_the_wheel_holds_the_learners_materials_and_no_course_source(installed):
    python, work, _ = installed
    found = json.loads(_run([python, "-c", (
        "import json, labkit; from importlib.metadata import version; "
        "from labkit.lessons.materials import material_files, learners_notebooks; "
        "print(json.dumps({'labkit': labkit.__file__, 'version': labkit.__version__, "
        "'distribution': version('labkit-course'), 'folder': str(learners_notebooks()), "
        "'files': [n for n, _ in material_files()]}))")], work, 120).stdout)
    assert found["version"] == found["distribution"]
    env = python.parent.parent
    assert Path(found["labkit"]).is_relative_to(env) and Path(found["folder"]).is_relative_to(env)
    expected = sorted(p.relative_to(REPO / "notebooks").as_posix()
                      for p in (REPO / "notebooks").rglob("*")
                      if p.is_file() and p.suffix in (".ipynb", ".json", ".txt")
                      and ".ipynb_checkpoints" not in p.parts)
    assert sorted(found["files"]) == expected
    site = Path(found["labkit"]).parent
    assert not (site.parent / "course").exists() and not (site / "course").exists()


@pytest.mark.timeout(INSTALL_S + 600)  # the first one builds and installs
def test_doctor_runs_from_the_installed_wheel(installed):
    python, work, _ = installed
    result = _run([python, "-m", "labkit", "doctor"], work, 180)
    assert "torch 2.13.0" in result.stdout
    assert "ok   2-rank all_reduce on cpu" in result.stdout


@pytest.mark.timeout(INSTALL_S + 600)  # the first one builds and installs
def test_a_lesson_copied_out_runs_under_papermill(installed):
    python, work, times = installed
    lessons = work / "lessons"
    copied = _run([python, "-m", "labkit", "notebooks", lessons], work, 60).stdout
    assert f"next: jupyter lab {lessons}" in copied
    assert (lessons / f"{LESSON}.ipynb").is_file()
    assert (lessons / "quizzes" / f"{LESSON}.json").is_file()
    again = _run([python, "-m", "labkit", "notebooks", lessons], work, 60).stdout
    assert "0 file(s) written" in again and "already up to date" in again

    _run([python, "-m", "ipykernel", "install", "--prefix", python.parent.parent,
          "--name", "labkit-wheel"], work, 60)  # a kernel of this environment, by name
    results, executed = work / "results.json", work / "executed.ipynb"
    start = time.perf_counter()
    _run([python, "-m", "papermill", lessons / f"{LESSON}.ipynb", executed, "-k",
          "labkit-wheel", "--cwd", lessons, "--no-progress-bar", "-y",
          json.dumps(SMOKE[LESSON])], work, 600, LABKIT_RESULTS=str(results))
    times["run 00 under papermill"] = time.perf_counter() - start
    recorded = json.loads(results.read_text())
    assert recorded, "the lesson recorded no results"
    cells = json.loads(executed.read_text())["cells"]
    install = next(c for c in cells if c["cell_type"] == "code")
    assert "%pip install" in "".join(install["source"]) and not install["outputs"], \
        "the install cell did something although labkit is installed"
    errors = [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    print("test_package times (s):", {k: round(v, 1) for k, v in times.items()})


def test_an_editable_install_reads_the_checkouts_notebooks(tmp_path):
    """``pip install -e`` (as requirements.txt does) maps ``labkit`` onto the checkout, whose
    ``labkit/notebooks`` is the checkout's ``notebooks/``: importlib.resources finds them."""
    source = _source_copy(tmp_path)
    python = _fresh_venv(tmp_path / "env")
    # built by this environment's setuptools, installed into the fresh one (--prefix);
    # --ignore-installed, or pip would first uninstall this environment's own labkit-course
    _run(_pip("install", "-q", "--no-deps", "--no-build-isolation", "--ignore-installed",
              "--prefix", python.parent.parent, "-e", source), tmp_path, 300)
    # labkit's own imports need torch, which --no-deps leaves out: ask where the import
    # system puts the package, as importlib.resources.files("labkit") does.
    where = _run([python, "-c", "import importlib.util; "
                  "print(importlib.util.find_spec('labkit').submodule_search_locations[0])"],
                 tmp_path, 60).stdout.strip()
    notebooks = Path(where) / "notebooks"
    assert Path(where) == source / "labkit"
    assert (notebooks / "quizzes" / f"{LESSON}.json").read_bytes() == \
        (source / "notebooks" / "quizzes" / f"{LESSON}.json").read_bytes()
    assert notebooks.resolve() == (source / "notebooks").resolve()
    # and the suite's own environment still has its labkit (the tests after this one run it)
    importlib.metadata.distribution("labkit-course")


def test_the_install_cells_name_the_projects_repository():
    # pyproject.toml's [project.urls], the one place the repository's address is kept
    url = re.search(r'^Repository = "(.+)"$', (REPO / "pyproject.toml").read_text(), re.M)[1]
    for path in sorted((REPO / "course").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
        assert "except ModuleNotFoundError" in first and f"git+{url}" in first, path.name


_CELL_PROBE = r"""
import json, sys
from IPython.core.interactiveshell import InteractiveShell
source, fake = json.loads(sys.argv[1]), sys.argv[2]
if fake:  # a labkit whose own import needs a module that is not there
    sys.path.insert(0, fake)
else:
    sys.modules["labkit"] = None  # importing it raises ModuleNotFoundError, named labkit
shell = InteractiveShell.instance()
shell.register_magic_function(lambda line: print("pip:", line), "line", "pip")
error = shell.run_cell(source).error_in_exec
print("RESULT", type(error).__name__, getattr(error, "name", None), error)
"""


@pytest.mark.parametrize("missing", ["labkit", "a dependency"])
def test_the_install_cell_stops_with_one_clear_message(missing, tmp_path):
    """labkit missing and pip failing (no network here: ``%pip`` is stubbed): the cell tries
    the install once and stops with one message saying what to do. Something labkit needs
    missing instead: the cell installs nothing and shows that import's own error."""
    cells = json.loads((REPO / "course" / f"{LESSON}.ipynb").read_text())["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    fake = ""
    if missing != "labkit":
        (tmp_path / "labkit").mkdir()
        (tmp_path / "labkit" / "__init__.py").write_text("import labkit_needs_this\n")
        fake = str(tmp_path)
    out = _run([sys.executable, "-c", _CELL_PROBE, json.dumps(first), fake], tmp_path,
               60).stdout
    if missing == "labkit":
        assert "labkit is not installed in this kernel" in out and "pip: install -q" in out
        assert "RESULT SystemExit None labkit could not be installed" in out
        assert "restart the kernel" in out
    else:
        assert "pip:" not in out and "not installed" not in out
        assert "RESULT ModuleNotFoundError labkit_needs_this" in out


def test_notebooks_keeps_a_learners_edits_unless_forced(tmp_path, capsys):
    from labkit.__main__ import main

    lessons = tmp_path / "lessons"
    assert main(["notebooks", str(lessons)]) == 0
    first = capsys.readouterr().out
    assert f"wrote {lessons / f'{LESSON}.ipynb'}" in first
    assert f"next: jupyter lab {lessons}" in first
    assert not (lessons / "solutions").exists()  # reveal reads the package's
    mine = lessons / f"{LESSON}.ipynb"
    mine.write_text(mine.read_text().replace("Your cluster", "My cluster", 1))
    assert main(["notebooks", str(lessons)]) == 0
    again = capsys.readouterr().out
    assert f"kept {mine}" in again and "--force" in again and "My cluster" in mine.read_text()
    assert main(["notebooks", str(lessons), "--force"]) == 0
    assert f"replaced {mine}" in capsys.readouterr().out
    assert mine.read_bytes() == (REPO / "notebooks" / mine.name).read_bytes()


def test_notebooks_refuses_a_file_and_the_suites_own_folder(tmp_path, capsys):
    from labkit.__main__ import main

    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    assert main(["notebooks", str(a_file)]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert a_file.read_text() == "mine"
    assert main(["notebooks", str(REPO / "notebooks")]) == 2
    assert "the suite's own copy" in capsys.readouterr().err
    apps = REPO / "notebooks" / "apps"
    before = sorted(apps.iterdir())
    assert main(["notebooks", str(apps)]) == 2
    assert "or inside it" in capsys.readouterr().err
    assert sorted(apps.iterdir()) == before


def test_notebooks_refuses_a_package_that_holds_none(tmp_path, capsys, monkeypatch):
    """A checkout without symbolic links has labkit/notebooks as a text file: nothing to
    copy is an error, not "0 file(s) written"."""
    import labkit.classroom.fetch as fetch_module
    from labkit.__main__ import main

    monkeypatch.setattr(fetch_module, "material_files", lambda: [])
    assert main(["notebooks", str(tmp_path / "lessons")]) == 2
    assert "holds no notebooks" in capsys.readouterr().err
    assert not (tmp_path / "lessons").exists()


def test_a_notebook_alone_reads_its_quiz_and_solutions_from_the_package(tmp_path,
                                                                         monkeypatch):
    """As on Colab: no quizzes/ or solutions/ beside the notebook."""
    from labkit.lessons.exercise.solutions import reveal
    from labkit.lessons.show.quiz import quiz_source
    from labkit.lessons.show.quizzes import load_quiz

    monkeypatch.chdir(tmp_path)
    source = quiz_source(f"quizzes/{LESSON}.json")
    assert source.read_bytes() == (REPO / "notebooks" / "quizzes" / f"{LESSON}.json").read_bytes()
    assert load_quiz(source)
    assert reveal("ring_all_reduce").code
