"""Grade submitted notebooks: execute each one afresh, read what its checks and quizzes found.

    python -m labkit grade submissions/*.ipynb --out grades.csv

Each submission runs in a process of its own (papermill, a new kernel, so a new cluster), in a
temporary folder of its own, with a time limit per cell and per notebook; when the limit
passes, the whole process group (kernel and ranks) is killed. A notebook that raises or hangs
gets a row saying where, with the exercises it reached graded; the others are not affected.

* Exercises: every nbgrader grade cell (``nbgrader.grade = true``) of the executed notebook is
  read for the verdict its check displayed (``labkit.check.MIME_TYPE``): passed earns the
  cell's points; failed, not attempted, or not run (the notebook stopped before it) earn none.
  With the course's sources at hand (``--source``, by default the suite's ``course/``), the
  source decides (``sources.py``): the submission is matched to its course notebook (by name,
  else by its exercises' grade_ids), its check cells are restored from it (as nbgrader restores
  locked cells), and only the source's grade cells count, with the source's points; a deleted
  check earns nothing and still counts in ``max_points``. A submission that matches no source
  is not run ("no source").
* Quizzes: read from the submission as the learner saved it (the widget's record), and scored
  again from the quiz file: first answers only; a malformed record scores nothing.
* Processes: papermill runs under ``reaper.py``, which kills whatever the notebook left
  running (also in a session of its own) when papermill ends.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from labkit.check.result import MIME_TYPE
from labkit.check.solutions import GRADING_ENV
from labkit.classroom.quizzes import RECORD_MIME, load_quiz
from labkit.classroom.sources import find_source, grade_points, restore_checks

REPO = Path(__file__).resolve().parent.parent.parent
REAPER = Path(__file__).resolve().with_name("reaper.py")
NOT_RUN = "not run"
__all__ = ["exercise_results", "grade", "grade_submission", "quiz_scores", "restore_checks"]


def _meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _bundles(cell, mime: str) -> list:
    return [o["data"][mime] for o in cell.get("outputs", [])
            if o.get("output_type") in ("display_data", "execute_result")
            and mime in o.get("data", {})]


def _error(cell) -> str | None:
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            return f"{output['ename']}: {output['evalue']}"
    return None


def exercise_results(notebook, points: dict | None = None) -> list[dict]:
    """Per graded exercise of an executed notebook: grade_id, points, status, summary.

    ``points`` ({grade_id: points}, from the course's source): only those exercises count,
    worth that much, read from the last cell with that grade_id ("missing" if there is none).
    Without it, every grade cell of the notebook counts with the points it declares."""
    cells = {}
    for cell in notebook.cells:
        meta = _meta(cell)
        if meta.get("grade_id") and (meta.get("grade") or points is not None):
            cells[meta["grade_id"]] = cell
    points = points if points is not None else {g: _meta(c).get("points", 0)
                                                for g, c in cells.items()}
    results = []
    for grade_id, worth in points.items():
        cell = cells.get(grade_id)
        found = _bundles(cell, MIME_TYPE) if cell is not None else []
        verdict = found[-1] if found and isinstance(found[-1], dict) else None
        status = str(verdict.get("status")) if verdict else NOT_RUN if cell else "missing"
        summary = (str(verdict.get("summary")) if verdict else
                   (_error(cell) or "the notebook stopped before this cell") if cell else
                   "the check cell was deleted")
        results.append({"grade_id": grade_id, "points": worth, "status": status,
                        "earned": worth if status == "passed" else 0, "summary": summary})
    return results


def quiz_scores(notebook, quiz_dir: Path) -> dict[str, tuple[int, int]]:
    """Quiz name -> (score, max), from the records saved in a notebook, re-scored."""
    scores = {}
    for cell in notebook.cells:
        for record in _bundles(cell, RECORD_MIME):
            name = record.get("quiz") if isinstance(record, dict) else None
            path = Path(quiz_dir) / f"{name}.json"
            if not isinstance(name, str) or "/" in name or not path.exists():
                continue  # a quiz this course does not have: nothing to score it against
            questions = load_quiz(path)
            answers, expected = record.get("answers"), record.get("expected")
            answers = answers if isinstance(answers, dict) else {}
            expected = expected if isinstance(expected, dict) else {}
            score = sum(q.is_right(entry["first"], expected.get(q.id)) for q in questions
                        if isinstance(entry := answers.get(q.id), dict) and "first" in entry)
            scores[name] = (score, len(questions))
    return scores


@dataclass
class Submission:
    path: Path
    course: str = ""  # the course notebook it was graded as (its source's name)
    status: str = "graded"
    detail: str = ""
    exercises: list = field(default_factory=list)
    quizzes: dict = field(default_factory=dict)
    seconds: float = 0.0

    def row(self) -> dict:
        row = {"submission": str(self.path), "notebook": self.path.stem,
               "graded_as": self.course, "status": self.status,
               "detail": self.detail, "seconds": f"{self.seconds:.1f}",
               "points": sum(e["earned"] for e in self.exercises),
               "max_points": sum(e["points"] for e in self.exercises)}
        row.update({f"exercise:{e['grade_id']}": e["status"] for e in self.exercises})
        row.update({f"quiz:{name}": f"{score}/{top}" for name, (score, top)
                    in self.quizzes.items()})
        return row


def _kill_tree(pid: int) -> None:
    """Kill a process and everything below it (papermill, its kernel, the kernel's ranks)."""
    import psutil

    try:
        parent = psutil.Process(pid)
        family = parent.children(recursive=True) + [parent]
    except psutil.NoSuchProcess:
        return
    for process in family:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(family, timeout=10)


def _execute(src: Path, dst: Path, work: Path, parameters: dict, cell_timeout: float,
             timeout: float) -> tuple[str, str]:
    """Run papermill in a process of its own; (status, detail)."""
    command = [sys.executable, str(REAPER), sys.executable, "-m", "papermill", str(src),
               str(dst), "--cwd", str(work),
               "--kernel", "python3", "--execution-timeout", str(int(cell_timeout)),
               "--no-progress-bar", "--no-log-output"]
    if parameters:
        command += ["-y", json.dumps(parameters)]
    log = open(work / "papermill.log", "w")
    # reveal shows nothing in a graded kernel: an answer cell that runs the reference
    # solution (exec(labkit.check.reveal(...).code)) earns nothing
    env = dict(os.environ, **{GRADING_ENV: "1"})
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, start_new_session=True, env=env)
    try:
        code = process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_tree(process.pid)
        return "timeout", f"stopped after {timeout:g} s (a cell or the notebook hung)"
    finally:
        log.close()
    if code == 0:
        return "graded", ""
    if not (work / "papermill.log").exists():
        return "error", "the notebook deleted its own working folder"
    log_text = (work / "papermill.log").read_text(errors="replace")
    if "CellTimeoutError" in log_text or "Cell execution timed out" in log_text:
        return "timeout", f"a cell ran past the cell time limit ({cell_timeout:g} s)"
    tail = log_text.strip().splitlines()[-3:]
    return "error", " | ".join(tail)[-400:]


PAPERMILL_TAGS = {"papermill-error-cell-tag", "injected-parameters"}


def _where_it_stopped(notebook) -> str:
    """"cell N raised ...", N counting the submission's own cells (not papermill's)."""
    own = [c for c in notebook.cells
           if not PAPERMILL_TAGS & set(c.get("metadata", {}).get("tags", []))]
    for index, cell in enumerate(own):
        error = _error(cell)
        if error:
            return f"cell {index} raised {error}"
    return ""


def _course(path: Path, notebook, source_dir: Path | None):
    """(the course's source for this submission: its path, or None; whether a course is at
    hand: a ``source_dir`` holding notebooks)."""
    if source_dir is None or not any(Path(source_dir).glob("*.ipynb")):
        return None, False
    return find_source(path, notebook, source_dir), True


def grade_submission(path: Path, quiz_dir: Path, source_dir: Path | None = None,
                     parameters: dict | None = None, cell_timeout: float = 300,
                     timeout: float = 1800) -> Submission:
    """Execute one submission in a fresh folder and process; never raises for the notebook's
    own faults (they become the row's status)."""
    result, start = Submission(Path(path)), time.monotonic()
    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is a row, not a crash
        result.status, result.detail = "unreadable", f"{type(exc).__name__}: {exc}"
        return result
    result.quizzes = quiz_scores(notebook, quiz_dir)
    found, have_course = _course(Path(path), notebook, source_dir)
    if have_course and found is None:
        result.status = "no source"
        result.detail = (f"no notebook in {source_dir} has this file's name or any of its "
                         "exercises: grade it under its course name (e.g. 00_your_cluster"
                         ".ipynb); its own check cells are not trusted")
        return result
    source = nbformat.read(found, as_version=4) if found else None
    points = grade_points(source) if source is not None else None
    if source is not None:
        result.course = found.stem
        restore_checks(notebook, source)
    with tempfile.TemporaryDirectory(prefix="labkit-grade-", ignore_cleanup_errors=True) as tmp:
        work = Path(tmp)
        shutil.copytree(quiz_dir, work / "quizzes")
        src, dst = work / "submission.ipynb", work / "executed.ipynb"
        nbformat.write(notebook, src)
        result.status, result.detail = _execute(src, dst, work, parameters or {},
                                                cell_timeout, timeout)
        executed = nbformat.read(dst, as_version=4) if dst.exists() else notebook
    result.exercises = exercise_results(executed, points)
    if result.status == "error":
        result.detail = _where_it_stopped(executed) or result.detail
    result.seconds = time.monotonic() - start
    return result


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
          parameters: dict | None = None, cell_timeout: float = 300,
          timeout: float = 1800, jobs: int = 1, echo=print) -> list[Submission]:
    """Grade every submission in ``paths`` (notebooks, or folders of them) and write ``out``
    (CSV, in the order given). ``jobs`` submissions run at once, each in its own process and
    folder."""
    from concurrent.futures import ThreadPoolExecutor

    quiz_dir = Path(quiz_dir or REPO / "notebooks" / "quizzes")
    source_dir = source_dir if source_dir is not None else (
        REPO / "course" if (REPO / "course").is_dir() else None)

    def one(path) -> Submission:
        try:
            result = grade_submission(Path(path), quiz_dir, source_dir, parameters,
                                      cell_timeout, timeout)
        except Exception as exc:  # noqa: BLE001 - one submission never stops the others
            result = Submission(Path(path), "error", f"grading failed: {type(exc).__name__}: "
                                f"{exc}"[:400])
        row = result.row()
        echo(f"{path}: {result.status}, {row['points']}/{row['max_points']} points"
             + (f" ({result.detail})" if result.detail else ""))
        return result

    paths = submissions(paths, echo)
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(one, paths))
    rows = [r.row() for r in results]
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    return results
