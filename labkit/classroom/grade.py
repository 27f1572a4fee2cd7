"""Grade submitted notebooks: the grader runs every check itself, each submission sandboxed.

    python -m labkit grade submissions/ --source ../course-private --out grades.csv --jobs 2

For each submission the course's source decides what runs (``sources.py``): it is matched to
its course notebook (by name, else by its exercises' grade_ids), and the grader's checker
(``checker.py``) runs that notebook's cells as the learners received them, with only the
learner's answer cells (nbgrader ``solution`` cells) taken from the submission, and those run
on the ranks only. Every verdict is computed in the checker, a process that imports labkit
before any learner code and sends its findings over a pipe; nothing the submission displayed
or saved counts, except the quiz answers (below). Each submission runs in a sandbox of its own
(``sandbox.py``: bubblewrap, limits, a cgroup) with a time limit per cell and per notebook;
whatever it started is killed when it ends.

* Exercises: each check cell of the source earns its points if the checker's verdict is
  passed and the cell's hidden tests (run by the checker after it) raise nothing; failed,
  not attempted or not run (the run stopped before it) earn none.
* Quizzes: the learner's *first* answers are read from the record the quiz widget saved in the
  submission (the only thing read from it besides the answer cells), scored against the quiz
  file, with the values of measured questions from the checker's own run. A record that does
  not parse scores 0 and the row says so.
"""

from __future__ import annotations

import csv
import math
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.classroom import cgroup as cgroups
from labkit.classroom import verdicts
from labkit.classroom.answers import review_notes
from labkit.classroom.sandbox import Limits, SandboxError, problem
from labkit.classroom.sources import checker_cells, find_source, grade_points
from labkit.classroom.verdicts import Findings, prepare_job, run_checker
from labkit.lessons.exercise.result import MIME_TYPE
from labkit.lessons.materials import quizzes_folder
from labkit.lessons.show.quizzes import RECORD_MIME, load_quiz

# The checkout this labkit runs from, if it is one: its course/ holds the sources the grader
# runs by default (they are not package data: they hold the solutions and hidden tests).
REPO = Path(__file__).resolve().parent.parent.parent
NOT_RUN = "not run"
MAX_NOTEBOOK_BYTES = 64 * 2**20  # a submission is parsed by the grader itself, unsandboxed
JOB_PREFIX = "labkit-grade-"  # a submission's job folder: labkit-grade-<grader's pid>-...
UNSAFE = ("--unsafe-no-sandbox: each submission's code then runs as you, with your files, "
          "your network and no limits but the time limits; grade only work you trust that "
          "way, or install bubblewrap (apt-get install -y bubblewrap)")
__all__ = ["SandboxError", "exercise_results", "grade", "grade_submission", "quiz_scores",
           "verdict_results"]


def verdict_results(findings: Findings, points: dict) -> list[dict]:
    """Per check cell of the source: grade_id, points, status, earned, summary, from the
    grader's own verdicts."""
    results = []
    for grade_id, worth in points.items():
        verdict = findings.verdicts.get(grade_id, ...)
        if verdict is ...:
            status, summary = NOT_RUN, findings.detail or "the grader's run stopped before it"
        elif not isinstance(verdict, dict):
            status, summary = "failed", "the check cell showed no verdict"
        else:
            status, summary = str(verdict.get("status")), str(verdict.get("summary"))
        results.append({"grade_id": grade_id, "points": worth, "status": status,
                        "earned": worth if status == "passed" else 0, "summary": summary})
    return results


def exercise_results(notebook) -> list[dict]:
    """The verdicts an executed notebook *displayed* (``labkit.check.MIME_TYPE``), per grade
    cell: for the suite's own runs of its course (``tests/test_notebooks.py``), never for
    grading, where the submission could have displayed anything."""
    results = []
    for cell in notebook.cells:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if not (meta.get("grade") and meta.get("grade_id")):
            continue
        shown = [o["data"][MIME_TYPE] for o in cell.get("outputs", [])
                 if MIME_TYPE in o.get("data", {})]
        verdict = shown[-1] if shown and isinstance(shown[-1], dict) else {}
        status = str(verdict.get("status", NOT_RUN))
        results.append({"grade_id": meta["grade_id"], "points": meta.get("points", 0),
                        "status": status, "summary": str(verdict.get("summary", ""))})
    return results


def _records(notebook) -> list:
    return [o["data"][RECORD_MIME] for cell in notebook.cells for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")
            and RECORD_MIME in o.get("data", {})]


def quiz_scores(notebook, quiz_dir: Path, expected: dict) -> tuple[dict, list[str]]:
    """({quiz: (score, max)}, notes): first answers from the submission's records, measured
    values from ``expected`` ({quiz: {question id: value}}, the grader's run)."""
    scores, notes = {}, []
    for record in _records(notebook):
        name = record.get("quiz") if isinstance(record, dict) else None
        path = Path(quiz_dir) / f"{name}.json"
        if not isinstance(name, str) or "/" in name or not path.exists():
            notes.append("a quiz record that names no quiz of this course was ignored")
            continue
        questions, answers = load_quiz(path), record.get("answers")
        if not isinstance(answers, dict):
            scores[name] = (0, len(questions))
            notes.append(f"quiz {name}: its saved record does not parse: scored 0")
            continue
        measured, score, unread = expected.get(name), 0, 0
        for q in questions:
            entry = answers.get(q.id)
            if entry is None:
                continue
            if not isinstance(entry, dict) or not _answer_parses(q, entry.get("first")):
                unread += 1
            elif q.kind != "number" or (measured and q.id in measured):
                score += q.is_right(entry["first"], (measured or {}).get(q.id))
        if unread:
            notes.append(f"quiz {name}: {unread} saved answer(s) do not parse: scored 0")
        if measured is None and any(q.kind == "number" for q in questions):
            notes.append(f"quiz {name}: the grader's run did not reach the quiz, so its "
                         "measured questions scored 0")
        scores[name] = (score, len(questions))
    return scores, notes


def _answer_parses(question, first) -> bool:
    """A first answer the quiz widget could have saved: an option's index for a choice, a
    finite number for a number (never ``true``, which Python would read as 1)."""
    if isinstance(first, bool):
        return False
    if question.kind == "choice":
        return isinstance(first, int) and 0 <= first < len(question.options)
    try:
        return isinstance(first, (int, float)) and math.isfinite(float(first))
    except OverflowError:  # an int past float's range: 10**400
        return False


@dataclass
class Submission:
    path: Path
    course: str = ""  # the course notebook it was graded as (its source's name)
    status: str = "graded"
    detail: str = ""
    exercises: list = field(default_factory=list)
    quizzes: dict = field(default_factory=dict)
    seconds: float = 0.0
    review: str = ""  # what in its answer cells an instructor should read (review_notes)

    def row(self) -> dict:
        row = {"submission": str(self.path), "notebook": self.path.stem,
               "graded_as": self.course, "status": self.status,
               "detail": self.detail, "review": self.review,
               "seconds": f"{self.seconds:.1f}",
               "points": sum(e["earned"] for e in self.exercises),
               "max_points": sum(e["points"] for e in self.exercises)}
        row.update({f"exercise:{e['grade_id']}": e["status"] for e in self.exercises})
        row.update({f"quiz:{name}": f"{score}/{top}" for name, (score, top)
                    in self.quizzes.items()})
        return row


STATUS = {"done": "graded", "error": "error", "timeout": "timeout", "died": "error"}


def _detail(findings: Findings, exercises: list, notes: list) -> str:
    parts = [findings.detail] if findings.detail else []
    if findings.limits:
        parts.append("contained: the submission " + ", ".join(findings.limits))
    parts += [f"{e['grade_id']}: {e['summary']}"[:300] for e in exercises
              if e["status"] not in ("passed", NOT_RUN)]
    return " | ".join(parts + notes)


def grade_submission(path: Path, quiz_dir: Path, source_dir: Path | None,
                     parameters: dict | None = None, cell_timeout: float = 300,
                     timeout: float = 1800, sandboxed: bool = True,
                     limits: Limits = Limits()) -> Submission:
    """Grade one submission (see the module's docstring); never raises for the notebook's own
    faults (they become the row's status)."""
    result, start = Submission(Path(path)), time.monotonic()
    refused = _refused(Path(path), source_dir)
    if refused:
        result.status, result.detail = "unreadable", refused
        return result
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a row, not a crash
        # the type only: nbformat's messages quote the file's content
        result.status = "unreadable"
        result.detail = f"{type(exc).__name__}: the file is not a notebook nbformat can read"
        return result
    found = (find_source(Path(path), notebook, source_dir)
             if source_dir is not None and any(Path(source_dir).glob("*.ipynb")) else None)
    if found is None:
        result.status = "no source"
        result.detail = (f"no course notebook in {source_dir} has this file's name or any of "
                         "its exercises: grade it with the course's sources (--source) under "
                         "its course name (e.g. 00_your_cluster.ipynb)")
        return result
    source = nbformat.read(found, as_version=4)
    result.course = found.stem
    cells = checker_cells(source, notebook, parameters)
    result.review = "; ".join(
        f"cell {cell['position']} uses {', '.join(found)}" for cell in cells
        if cell["kind"] == "answer" and (found := review_notes(cell["source"])))
    hidden = [cell.pop("hidden") for cell in cells if "hidden" in cell]
    spec = {"cells": cells, "cell_timeout": cell_timeout}
    with tempfile.TemporaryDirectory(prefix=f"{JOB_PREFIX}{os.getpid()}-",
                                     ignore_cleanup_errors=True) as tmp:
        prepare_job(Path(tmp), spec, Path(quiz_dir), sandboxed)
        findings = run_checker(Path(tmp), hidden, timeout, sandboxed, limits)
    result.status = STATUS[findings.ending]
    result.exercises = verdict_results(findings, grade_points(source))
    result.quizzes, notes = quiz_scores(notebook, quiz_dir, findings.expected)
    result.detail = _detail(findings, result.exercises, notes)
    result.seconds = time.monotonic() - start
    return result


def _refused(path: Path, source_dir: Path | None) -> str:
    """Why the grader does not read ``path`` ("" if it does)."""
    if path.is_symlink() or not path.is_file():
        # read as the grader, a link could point at any of its files (/etc/shadow as root)
        return "not a regular file (a symbolic link, a device or a folder): not read"
    sources = [s for place in {source_dir, REPO / "course"} if place is not None
               for s in Path(place).glob("*.ipynb")]
    if any(os.path.samefile(path, source) for source in sources):
        # reached through a linked folder (or a hard link): it would be graded as the learner's
        return "it is one of the course's sources (a link on its path leads there): not read"
    if path.stat().st_size > MAX_NOTEBOOK_BYTES:
        return (f"larger than {MAX_NOTEBOOK_BYTES // 2**20} MiB, more than any notebook of "
                "the course with its outputs: not read")
    return ""


def _cell_text(value):
    """A CSV cell a spreadsheet shows as text: a learner's file name or message that starts
    like a formula (``=HYPERLINK(...)``) is prefixed with an apostrophe (OWASP's advice)."""
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


def submissions(paths, echo=print) -> list[Path]:
    """``paths`` with each folder replaced by the notebooks under it (sorted; Jupyter's
    checkpoints left out). Raises ``FileNotFoundError`` if that leaves none."""
    found = []
    for path in map(Path, paths):
        if not path.is_dir():
            found.append(path)
            continue
        inside = sorted(p for p in path.rglob("*.ipynb") if ".ipynb_checkpoints" not in p.parts)
        if not inside:
            echo(f"{path}: a folder with no notebook in it")
        found += inside
    if not found:
        raise FileNotFoundError(f"no notebooks to grade in {', '.join(map(str, paths))}")
    return found


def grade(paths, out: Path, quiz_dir: Path | None = None, source_dir: Path | None = None,
          parameters: dict | None = None, cell_timeout: float = 300, timeout: float = 1800,
          jobs: int = 1, sandboxed: bool = True, limits: Limits = Limits(),
          echo=print) -> list[Submission]:
    """Grade every submission in ``paths`` (notebooks, or folders of them) and write ``out``
    (CSV, in the order given). ``jobs`` submissions run at once, each in its own sandbox.
    Raises ``SandboxError`` if ``sandboxed`` and no sandbox can be made here."""
    from concurrent.futures import ThreadPoolExecutor

    if sandboxed and (why := problem()):
        raise SandboxError(f"cannot grade in a sandbox here: {why}. To grade anyway, pass "
                           + UNSAFE)
    if not sandboxed:
        echo("warning: grading without a sandbox (" + UNSAFE + ")")
    quiz_dir = Path(quiz_dir or quizzes_folder())
    source_dir = source_dir if source_dir is not None else (
        REPO / "course" if (REPO / "course").is_dir() else None)

    def one(path) -> Submission:
        try:
            result = grade_submission(Path(path), quiz_dir, source_dir, parameters,
                                      cell_timeout, timeout, sandboxed, limits)
        except Exception as exc:  # noqa: BLE001 - one submission never stops the others
            result = Submission(Path(path), status="error", detail=(
                f"grading failed: {type(exc).__name__}: {exc}")[:400])
        row = result.row()
        echo(f"{path}: {result.status}, {row['points']}/{row['max_points']} points"
             + (f" ({result.detail})" if result.detail else ""))
        return result

    paths = submissions(paths, echo)
    verdicts.resume()
    remove_stale_jobs()  # left by a grader killed with SIGKILL, with its cgroups
    if sandboxed and cgroups.usable():
        cgroups.remove_stale()
    pool = ThreadPoolExecutor(max_workers=max(1, jobs))
    try:
        results = list(pool.map(one, paths))
    except BaseException:  # Ctrl-C: stop the sandboxes running now, start no other
        verdicts.stop_all()
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    write_grades(results, out)
    return results


def remove_stale_jobs(folder: Path | None = None) -> int:
    """Remove the job folders (the learners' cells, the quiz files) that graders no longer
    running left in ``folder`` (the temporary folder): one killed with SIGKILL cannot remove
    its own. How many were removed."""
    import psutil

    removed = 0
    for job in Path(folder or tempfile.gettempdir()).glob(f"{JOB_PREFIX}*-*"):
        owner = job.name[len(JOB_PREFIX):].split("-")[0]
        if (owner.isdigit() and not psutil.pid_exists(int(owner)) and job.is_dir()
                and not job.is_symlink()):
            shutil.rmtree(job, ignore_errors=True)
            removed += 1
    return removed


def write_grades(results: list[Submission], out: Path) -> None:
    """The grades file: one row per submission, every column any row has; written beside
    ``out`` and moved onto it, so that it is never half-written, even if killed."""
    rows = [{key: _cell_text(value) for key, value in r.row().items()} for r in results]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    partial = Path(f"{out}.partial")
    with open(partial, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, out)
