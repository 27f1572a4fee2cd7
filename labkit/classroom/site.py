"""The course's web site: the user guide, every lesson with its outputs, the API reference.

    python -m labkit docs --out site/                    # executes the lessons first (slow)
    python -m labkit docs --out site/ --executed DIR     # lessons executed already

The site is built from a checkout of the repository by ``mkdocs build --strict`` (a broken
link, anchor or API reference fails the build) from a staging copy, so nothing in the
checkout is written: ``mkdocs.yml`` and ``docs/`` as they are, ``figures/*.png`` in
``docs/figures/``, ``CHANGELOG.md`` (``docs/changelog.md`` includes it), the ``labkit``
sources (mkdocstrings reads their docstrings) and one page per lesson in ``docs/lessons/``
(``lesson_pages.lesson_page``). The lessons are executed at their classroom defaults, each
under papermill in ``course/``, or taken from ``--executed DIR``: course notebooks executed
so already, as ``LABKIT_LESSONS_DIR=DIR pytest tests/test_notebooks.py`` keeps them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from labkit.classroom.lesson_pages import PageError, lesson_page

REPO = Path(__file__).resolve().parents[2]
CELL_TIMEOUT_S = 600
MARKER = ".labkit-site"  # in a folder this builds: it may be built into again
LESSONS_MINUTES = 15  # all lessons at their classroom defaults, on 2 CPU cores


class SiteError(Exception):
    """The site cannot be built: the message says what to change."""


def checkout(repo: Path = REPO) -> Path:
    """The repository the site is built from, checked to hold what the build reads."""
    missing = [name for name in ("mkdocs.yml", "docs", "course", "figures", "CHANGELOG.md")
               if not (repo / name).exists()]
    if missing:
        raise SiteError(f"the site is built from a checkout of the repository; {repo} has no "
                        f"{', '.join(missing)}: run this from a `git clone` of labkit")
    return repo


def check_tools(executing: bool) -> None:
    """The build's packages are installed (checked before anything slow starts)."""
    import importlib.util

    needed = {"mkdocs": "mkdocs", "material": "mkdocs-material", "mkdocs_jupyter":
              "mkdocs-jupyter", "mkdocstrings_handlers.python": "mkdocstrings[python]"}
    if executing:
        needed["papermill"] = "papermill"
    missing = [package for module, package in needed.items()
               if importlib.util.find_spec(module.split(".")[0]) is None
               or importlib.util.find_spec(module) is None]
    if missing:
        raise SiteError(f"the site's build needs {', '.join(missing)}: pip install -e '.[docs]' "
                        f"in the checkout (or pip install {' '.join(missing)})")


def lesson_stems(repo: Path = REPO) -> list[str]:
    return sorted(p.stem for p in (repo / "course").glob("*.ipynb"))


def check_out_dir(out: Path, repo: Path = REPO) -> Path:
    """``out`` resolved, if the site may go there: a new or empty folder, or one this built."""
    out = Path(out).expanduser().resolve()
    if out.exists() and not out.is_dir():
        raise SiteError(f"--out {out} is a file: name a folder for the site")
    if out.is_dir() and any(out.iterdir()) and not (out / MARKER).exists():
        raise SiteError(f"--out {out} is not empty and holds no site built by this command: "
                        "name a new or empty folder (the build replaces its contents)")
    if repo.resolve().is_relative_to(out) or out.is_relative_to(repo.resolve() / "docs"):
        raise SiteError(f"--out {out} would hold the repository or sit in docs/: name a "
                        "folder outside docs/, such as site/")
    return out


def executed_lessons(folder: Path, stems: list[str]) -> dict[str, Path]:
    """{stem: executed notebook} in ``folder``, one for every lesson."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise SiteError(f"--executed {folder} is not a folder of executed notebooks")
    missing = [s for s in stems if not (folder / f"{s}.ipynb").is_file()]
    if missing:
        raise SiteError(f"--executed {folder} has no {', '.join(f'{s}.ipynb' for s in missing)}"
                        ": every lesson in course/ needs its executed notebook")
    return {s: folder / f"{s}.ipynb" for s in stems}


def check_nav(stems: list[str], repo: Path = REPO) -> None:
    """mkdocs.yml's nav lists a page for every lesson."""
    config = (repo / "mkdocs.yml").read_text()
    unlisted = [s for s in stems if f"lessons/{s}.ipynb" not in config]
    if unlisted:
        raise SiteError(f"mkdocs.yml's nav lists no lessons/{unlisted[0]}.ipynb: add every "
                        "lesson of course/ to it")


def execute_lessons(stems: list[str], folder: Path, say=print,
                    repo: Path = REPO) -> dict[str, Path]:
    """Run each course notebook at its classroom defaults (no parameter injected) into
    ``folder``, saying how each went; returns {stem: executed notebook}."""
    import papermill

    say(f"executing {len(stems)} lessons at their classroom defaults (about "
        f"{LESSONS_MINUTES} minutes on 2 CPU cores; --executed DIR takes executed ones)")
    done, start = {}, time.perf_counter()
    for n, stem in enumerate(stems, 1):
        began, target = time.perf_counter(), folder / f"{stem}.ipynb"
        say(f"[{n:2d}/{len(stems)}] {stem} ...")
        try:
            papermill.execute_notebook(str(repo / "course" / f"{stem}.ipynb"), str(target),
                                       kernel_name="python3", cwd=str(repo / "course"),
                                       execution_timeout=CELL_TIMEOUT_S, progress_bar=False)
        except papermill.PapermillExecutionError as error:
            raise SiteError(f"{stem} failed in cell {error.cell_index}: {error.ename}: "
                            f"{error.evalue} (the executed notebook is {target})") from None
        except Exception as error:  # noqa: BLE001 - a cell past its time, a dead kernel
            raise SiteError(f"{stem} did not finish: {type(error).__name__}: "
                            f"{str(error)[:500]} (the executed notebook is {target})") from None
        done[stem] = target
        say(f"[{n:2d}/{len(stems)}] {stem}: {time.perf_counter() - began:.0f} s")
    say(f"lessons executed in {(time.perf_counter() - start) / 60:.1f} minutes")
    return done


def stage(staging: Path, executed: dict[str, Path], repo: Path = REPO) -> Path:
    """Write the site's sources to ``staging``; returns its mkdocs.yml."""
    check_nav(list(executed), repo)
    shutil.copy2(repo / "mkdocs.yml", staging / "mkdocs.yml")
    shutil.copy2(repo / "CHANGELOG.md", staging / "CHANGELOG.md")
    shutil.copytree(repo / "docs", staging / "docs")
    shutil.copytree(repo / "labkit", staging / "labkit", ignore=_not_source)
    (staging / "docs" / "figures").mkdir(exist_ok=True)
    for figure in sorted((repo / "figures").glob("*.png")):
        shutil.copy2(figure, staging / "docs" / "figures" / figure.name)
    lessons = staging / "docs" / "lessons"
    lessons.mkdir(exist_ok=True)
    for stem, path in executed.items():
        source = nbformat.read(repo / "course" / f"{stem}.ipynb", as_version=4)
        try:
            page = lesson_page(nbformat.read(path, as_version=4), source, stem)
        except PageError as error:
            raise SiteError(f"{path}: {error}") from None
        nbformat.write(page, lessons / f"{stem}.ipynb")
    return staging / "mkdocs.yml"


def _not_source(folder: str, names: list[str]) -> list[str]:
    """What mkdocstrings need not read in ``labkit/``: all but Python files and packages (the
    data it holds, a link to ``notebooks/`` among them, and caches)."""
    def source(name: str) -> bool:
        path = Path(folder) / name
        if path.is_symlink() or name == "__pycache__":
            return False
        return path.is_dir() or name.endswith(".py")

    return [name for name in names if not source(name)]


def mkdocs_build(config: Path, out: Path) -> None:
    """``mkdocs build --strict``; a failure raises ``SiteError`` with mkdocs's complaints."""
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--clean",
                           "-f", str(config), "-d", str(out)],
                          capture_output=True, text=True, cwd=config.parent,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    if done.returncode != 0:
        said = [line for line in done.stderr.splitlines()
                if line.startswith(("WARNING", "ERROR")) or "Error" in line]
        raise SiteError("mkdocs build --strict failed:\n"
                        + "\n".join(said or done.stderr.splitlines()[-20:]))


def build_site(out: Path, executed: Path | None = None, say=print,
               repo: Path = REPO) -> dict[str, float]:
    """Build the site into ``out``; returns the seconds spent {"lessons", "build"}."""
    repo = checkout(repo)
    out, stems = check_out_dir(out, repo), lesson_stems(repo)
    check_tools(executing=executed is None)
    check_nav(stems, repo)
    pages = executed_lessons(executed, stems) if executed is not None else None
    seconds, ran = {"lessons": 0.0}, None
    if pages is None:  # kept if a lesson fails (the error names its notebook there)
        ran, start = Path(tempfile.mkdtemp(prefix="labkit-lessons-")), time.perf_counter()
        try:
            pages = execute_lessons(stems, ran, say, repo)
        except KeyboardInterrupt:  # a failed lesson keeps ``ran`` (its error names it)
            shutil.rmtree(ran, ignore_errors=True)
            raise
        seconds["lessons"] = time.perf_counter() - start
    with tempfile.TemporaryDirectory(prefix="labkit-site-") as work:
        work = Path(work)
        start = time.perf_counter()
        (work / "staging").mkdir()
        config = stage(work / "staging", pages, repo)
        built = work / "site"  # --out changes only once the whole build has passed
        mkdocs_build(config, built)
        (built / MARKER).write_text("built by python -m labkit docs\n")
        if out.exists():  # empty, or a site this built (check_out_dir)
            shutil.rmtree(out)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(built, out)
        seconds["build"] = time.perf_counter() - start
    if ran is not None:
        shutil.rmtree(ran, ignore_errors=True)
    say(f"site built in {seconds['build']:.0f} s: {out / 'index.html'}")
    return seconds
