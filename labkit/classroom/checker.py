"""The grader's own run of one submission: the course's cells, the learner's answers on the
ranks, every verdict computed here and sent to the grader over a pipe.

    python -m labkit.classroom.checker SPEC.json VERDICT_FD HIDDEN_FD    # by verdicts.py

``SPEC.json`` (written by ``grade.py`` from the course's source, ``sources.checker_cells``)
lists the notebook's code cells: the instructor's cells as the learners received them
(solutions and hidden tests removed), and in place of each answer cell the learner's source.
The hidden tests come apart, on ``HIDDEN_FD``.
This process, before it reads any learner code:

* makes itself non-dumpable (``prctl(PR_SET_DUMPABLE, 0)``), so that ranks in the same sandbox,
  which hold no capabilities, can neither read nor write its memory, nor open its pipe
  through ``/proc``;
* imports labkit and keeps its own reference to ``CheckResult``; calls
  ``distrust_ranks()`` (what ranks send is read as plain data and tensors, never code) and
  ``mark_checker_process()``; sets ``LABKIT_GRADING=1`` (for this process and the ranks), so
  that nothing in labkit shows a reference solution while grading.

The instructor's cells are executed here in order (IPython's syntax, such as the first cell's
``%pip``, translated to Python as a kernel does, and ``%%ranks`` run as the kernel runs it);
an answer cell is never executed here: the names it defines are bound to ``answers.Answer``
objects, run on the ranks. A check cell's
verdict is the last ``CheckResult`` it displayed or assigned, then its hidden tests run here,
read from ``HIDDEN_FD`` only when that cell is reached (they are in no file the sandbox can
read, and ranks started before never held them); one that raises fails the exercise. A quiz
cell's measured values
(``show_quiz(..., values=...)``) are this run's. Each finding is one JSON line on
``VERDICT_FD``, a pipe the grader opened; the ranks never hold it (the cluster's launcher
closes inherited descriptors). The first cell that raises or runs past the cell time limit
ends the run, as in papermill.
"""

from __future__ import annotations

import ast
import ctypes
import json
import os
import signal
import sys
import traceback
import types

PR_SET_DUMPABLE = 4  # linux/prctl.h


def _parse(source: str, name: str) -> ast.Module:
    """A cell's code; where it is IPython's (a ``%`` magic), as the kernel would run it."""
    try:
        return ast.parse(source, name)
    except SyntaxError:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(source), name)


class _Shell:
    """What ``get_ipython()`` is for the course's cells here: the magics they use, run as in
    a kernel (``%load_ext labkit``, then ``%%ranks cluster``: a cell run on every rank)."""

    def __init__(self, namespace: dict):
        self.namespace, self.ranks = namespace, None
        self.ranks_cells = 0  # a number per %%ranks cell: its traceback's file name

    def run_line_magic(self, name: str, line: str):
        if name == "load_ext" and line.strip() == "labkit":
            from labkit.runtime.cluster.magic import RanksCells

            self.ranks = self.ranks or RanksCells(self.namespace)
            return None
        raise RuntimeError(f"%{name} {line} does not run in the grader's checker")

    def run_cell_magic(self, name: str, line: str, cell: str):
        if name != "ranks" or self.ranks is None:
            raise RuntimeError(f"%%{name} does not run in the grader's checker (only "
                               "%%ranks, after %load_ext labkit)")
        self.ranks_cells += 1
        return self.ranks.run(line, cell, self.ranks_cells)


class CellTimeout(Exception):
    """A cell of the grader's run passed the cell time limit."""


def _harden() -> None:
    # ``python -m`` put the working folder first on sys.path: in the sandbox that is /tmp,
    # which the ranks write, so any module imported later (ipywidgets, a lesson's plotting)
    # would be the learner's file run here. Only installed modules are imported from now on.
    cwd = os.getcwd()
    sys.path[:] = [p for p in sys.path if p and os.path.abspath(p) != cwd]
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
    os.environ["LABKIT_GRADING"] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")


class Run:
    """Executes the spec's cells and reports to ``channel`` (a binary file)."""

    def __init__(self, spec: dict, channel, hidden):
        import labkit
        import labkit.lessons.widgets
        from labkit.classroom.answers import mark_checker_process
        from labkit.lessons.exercise.result import CheckResult
        from labkit.runtime.cluster.untrusted import distrust_ranks

        distrust_ranks(contained=bool(spec.get("sandboxed")))
        mark_checker_process()
        self.spec, self.channel, self.hidden, self.result_type = spec, channel, hidden, CheckResult
        self.shown: list = []
        self.namespace = {"__name__": "__main__", "display": self._display}
        shell = _Shell(self.namespace)
        self.namespace["get_ipython"] = lambda: shell
        self.answers: list[str] = []
        labkit.widgets.show_quiz = self._quiz

    def send(self, **event) -> None:
        self.channel.write((json.dumps(event, default=str) + "\n").encode())
        self.channel.flush()

    def _display(self, *objects, **_) -> None:
        self.shown.extend(objects)

    def _quiz(self, path, interactive=True, values=None):
        from labkit.lessons.show.quizzes import QuizError, load_quiz

        # the course's own file: ./quizzes is a link in /tmp, which the ranks may replace
        path = quiz_file(path, self.spec.get("quiz_dir"))
        questions, expected = load_quiz(path), {}
        for question in questions:
            try:
                value = question.expected(dict(values or {}))
            except QuizError:
                continue
            if value is not None:
                expected[question.id] = value
        self.send(event="quiz", quiz=os.path.splitext(os.path.basename(str(path)))[0],
                  expected=expected)

    def _bind_answer(self, source: str, names: list[str]) -> None:
        from labkit.classroom.answers import Answer

        self.answers.append(source)
        modules = {k: v.__name__ for k, v in self.namespace.items()
                   if isinstance(v, types.ModuleType)}
        for name in names:
            self.namespace[name] = Answer(name, tuple(self.answers), modules)

    def _execute(self, source: str, index: int) -> None:
        tree = _parse(source, f"<cell {index}>")
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, f"<cell {index}>", "exec"), self.namespace)  # noqa: S102
        if last is not None:
            value = eval(compile(ast.Expression(last.value), f"<cell {index}>", "eval"),
                         self.namespace)
            if value is not None:
                self.shown.append(value)

    def _verdict(self, before: dict) -> dict | None:
        found = [o for o in self.shown if isinstance(o, self.result_type)]
        found += [v for k, v in self.namespace.items()
                  if isinstance(v, self.result_type) and before.get(k) is not v]
        return found[-1].to_dict() if found else None

    def cell(self, index: int, cell: dict) -> None:
        if cell["kind"] == "answer":
            self._bind_answer(cell["source"], cell["names"])
            return
        self.shown, before = [], dict(self.namespace)
        signal.alarm(max(1, int(self.spec.get("cell_timeout", 300))))
        try:
            self._execute(cell["source"], index)
            if cell.get("grade_id"):
                verdict = self._hidden_tests(self._verdict(before))
                self.send(event="verdict", grade_id=cell["grade_id"], verdict=verdict)
        finally:
            signal.alarm(0)
            _close_figures()

    def _hidden_tests(self, verdict: dict | None) -> dict | None:
        """Run the check cell's hidden tests (read now, from the grader's pipe: ranks started
        before never saw them); one that raises turns a pass into a failure."""
        source = json.loads(self.hidden.readline() or '""')
        if not source.strip():
            return verdict
        try:
            exec(compile(source, "<hidden tests>", "exec"), self.namespace)  # noqa: S102
        except Exception as exc:  # noqa: BLE001 - any failing hidden test fails the exercise
            if verdict is None or verdict.get("status") == "passed":
                return dict(verdict or {}, status="failed", summary=(
                    f"a hidden test of this check failed ({type(exc).__name__})"))
        finally:
            del source
        return verdict

    def run(self) -> None:
        for index, cell in enumerate(self.spec["cells"]):
            try:
                self.cell(index, cell)
            except BaseException as exc:  # noqa: BLE001 - the run ends here, the grader says why
                self.send(event="error", cell=cell.get("position", index),
                          error=f"{type(exc).__name__}: {exc}"[:500],
                          timeout=isinstance(exc, CellTimeout),
                          traceback=traceback.format_exc()[-2000:])
                return
        self.send(event="done")


def quiz_file(path, quiz_dir: str | None) -> str:
    """Where the quiz a cell names (``quizzes/NN.json``) is read: in ``quiz_dir``, the job's
    read-only copy, by its file name alone; ``path`` itself when the spec names no folder."""
    return os.path.join(quiz_dir, os.path.basename(str(path))) if quiz_dir else str(path)


def _close_figures() -> None:
    if "matplotlib.pyplot" in sys.modules:
        sys.modules["matplotlib.pyplot"].close("all")


def _alarm(signum, frame):
    raise CellTimeout("the cell ran past the cell time limit")


def main(argv: list[str]) -> int:
    spec_path, fd, hidden_fd = argv[0], int(argv[1]), int(argv[2])
    _harden()
    for descriptor in (fd, hidden_fd):
        os.set_inheritable(descriptor, False)
    channel, hidden = os.fdopen(fd, "wb"), os.fdopen(hidden_fd, "rb")
    signal.signal(signal.SIGALRM, _alarm)
    with open(spec_path) as f:
        spec = json.load(f)
    if spec.get("quiz_dir") and not os.path.exists("quizzes"):
        os.symlink(spec["quiz_dir"], "quizzes")  # where the course's cells look for them
    run = Run(spec, channel, hidden)
    try:
        run.run()
    finally:
        channel.close()
        os._exit(0)  # the cluster's ranks are ended by the grader with the sandbox


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
