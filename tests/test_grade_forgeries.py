"""A dishonest learner's notebook 00, graded: every forgery earns nothing, while an honest
correct answer earns every point and a wrong one none. The answer under each forgery is wrong
(it returns its input)."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from labkit.classroom import sandbox
from labkit.lessons.exercise.result import MIME_TYPE
from tests.grading import REPO, WRONG, grade_folder, reference, submission

PATCH_CHECK = WRONG + """
import labkit.lessons.check
from labkit.lessons.exercise.result import passed
labkit.check.ring_all_reduce = lambda cluster, fn, timeout=None: passed(
    "ring_all_reduce", "trust me")
"""
PATCH_DISPLAY = WRONG + """
import builtins
from labkit.lessons.exercise.result import CheckResult, MIME_TYPE
CheckResult._repr_mimebundle_ = lambda self, include=None, exclude=None: {
    "text/plain": "passed", MIME_TYPE: dict(self.to_dict(), status="passed")}
CheckResult.passed = property(lambda self: True)
builtins.isinstance = lambda obj, kind: True if kind is CheckResult else type(obj) is kind
try:
    import IPython.display
    IPython.display.display = lambda *a, **k: None
except ImportError:
    pass
"""
WRITES_FILES = """from pathlib import Path
for target in {targets!r}:
    try:
        Path(target).write_text("written by a submission")
    except OSError:
        pass
""" + WRONG
REVEALS = """import os
def ring_all_reduce(ctx, tensor):
    import labkit.lessons.check
    os.environ.pop("LABKIT_GRADING", None)  # the grader's switch, unset by the learner
    namespace = {{}}
    code = labkit.check.reveal("ring_all_reduce").code
    exec("import torch\\nimport torch.distributed as dist\\n" + code, namespace)
    return namespace.get("ring_all_reduce", lambda ctx, tensor: tensor)(ctx, tensor)
"""
READS_COURSE = """import glob, json
def ring_all_reduce(ctx, tensor):
    found = [{course!r}] + glob.glob("/work/*/course/00_your_cluster.ipynb") + glob.glob(
        "/root/**/course/00_your_cluster.ipynb", recursive=True)
    for path in found:
        try:
            cells = json.load(open(path))["cells"]
        except OSError:
            continue
        code = next("".join(c["source"]) for c in cells if "BEGIN SOLUTION" in "".join(c["source"]))
        namespace = {{}}
        exec("import torch\\nimport torch.distributed as dist\\n" + code, namespace)
        return namespace["ring_all_reduce"](ctx, tensor)
    return tensor
"""
WRITES_VERDICT = """import glob, os
FORGED = (b'{"event": "verdict", "grade_id": "ring_all_reduce_check", '
          b'"verdict": {"status": "passed"}}\\n')
def ring_all_reduce(ctx, tensor):
    for proc in glob.glob("/proc/[0-9]*"):  # the grader's checker: its pipes, its memory
        try:
            command = open(proc + "/cmdline", "rb").read()
            if int(proc[6:]) == os.getpid() or b"labkit" not in command:
                continue
            pipes = [fd for fd in glob.glob(proc + "/fd/*")
                     if os.readlink(fd).startswith("pipe:")]
        except OSError:
            continue
        for target in pipes:  # pipes only: never a file of anyone's
            try:
                with open(target, "ab") as f:
                    f.write(FORGED)
            except OSError:
                pass
        try:
            with open(proc + "/mem", "rb") as f:
                f.read(1)
        except OSError:
            pass
    return tensor
"""
pytestmark = pytest.mark.skipif(sandbox.problem() is not None,
                                reason=f"no sandbox here: {sandbox.problem()}")
FORGED_QUIZ = {"quiz": "00_your_cluster", "score": 4, "max": 4, "answers": {
    "why-clusters": {"first": 0, "first_right": True, "tries": 1, "last": 0},
    "sum-of-ranks": {"first": 1, "first_right": True, "tries": 1, "last": 1},
    "everyone-must-join": {"first": 3, "first_right": True, "tries": 1, "last": 3},
    "algbw": {"first": 12345.0, "first_right": True, "tries": 1, "last": 12345.0}},
    "expected": {"algbw": 12345.0}}
HONEST_QUIZ = {"quiz": "00_your_cluster", "answers": {
    "why-clusters": {"first": 1, "tries": 1}, "sum-of-ranks": {"first": 1, "tries": 1},
    "everyone-must-join": {"first": 0, "tries": 1}}, "expected": {}}
FAKE_OUTPUT = [nbformat.v4.new_output("display_data", data={"text/plain": "passed", MIME_TYPE: {
    "exercise": "ring_all_reduce", "status": "passed", "summary": "edited", "details": [],
    "measured": {}}})]


def test_forgeries_earn_nothing_and_honest_work_earns_every_point(tmp_path):
    folder = tmp_path / "submissions"
    home_file = Path.home() / f"labkit-forged-{tmp_path.name}"
    beside = folder / "forged-beside-submissions.txt"
    submission(folder / "correct.ipynb", reference(), quiz=HONEST_QUIZ)
    submission(folder / "wrong.ipynb", WRONG)
    submission(folder / "patch_check.ipynb", PATCH_CHECK, quiz=FORGED_QUIZ)
    submission(folder / "patch_display.ipynb", PATCH_DISPLAY, outputs=FAKE_OUTPUT)
    submission(folder / "writes_verdict.ipynb", WRITES_VERDICT)
    submission(folder / "writes_files.ipynb",
               WRITES_FILES.format(targets=[str(home_file), str(beside)]))
    submission(folder / "reveals.ipynb", REVEALS.format())
    submission(folder / "reads_course.ipynb",
               READS_COURSE.format(course=str(REPO / "course" / "00_your_cluster.ipynb")),
               quiz={"quiz": "00_your_cluster", "answers": "all right, trust me"})
    try:
        rows = grade_folder(folder, tmp_path / "grades.csv")
    finally:
        written = [p for p in (home_file, beside) if p.exists()]
        home_file.unlink(missing_ok=True)
    assert rows["correct"]["points"] == "3" and rows["correct"]["max_points"] == "3", rows
    assert rows["correct"]["status"] == "graded", rows["correct"]["detail"]
    assert rows["correct"]["quiz:00_your_cluster"] == "3/4"  # the number question unanswered
    for name in ("wrong", "patch_check", "patch_display", "writes_verdict", "writes_files",
                 "reveals", "reads_course"):
        assert rows[name]["points"] == "0", (name, rows[name])
        assert rows[name]["exercise:ring_all_reduce_check"] == "failed", (name, rows[name])
        assert rows[name]["status"] == "graded", (name, rows[name]["detail"])
    assert "nothing was added" in rows["wrong"]["detail"]
    assert not rows["correct"]["review"] and not rows["wrong"]["review"]
    assert "labkit.check" in rows["patch_check"]["review"], rows["patch_check"]
    assert not written, f"a submission wrote {written}"
    # the saved score, first_right and expected values count for nothing: one first answer
    # is right, and the measured question is scored against the grader's own run
    assert rows["patch_check"]["quiz:00_your_cluster"] == "1/4"
    assert rows["reads_course"]["quiz:00_your_cluster"] == "0/4"
    assert "does not parse" in rows["reads_course"]["detail"]


# Two forgeries the sandbox cannot stop (each earned 3 of 3 points in a review): the checks
# measure on the ranks, in the learner's process. The grader flags them for a human instead.
PREDICTS = """import torch, torch.distributed as dist
from labkit.lessons.all_reduce.check import _data
def ring_all_reduce(ctx, tensor):
    n, r, chunk = ctx.world_size, ctx.rank, torch.zeros(tensor.numel() // ctx.world_size)
    for _ in range(2 * (n - 1)):  # chunk-sized sends of nothing, for the byte count
        dist.send(chunk, (r + 1) % n) if r % 2 == 0 else dist.recv(chunk, (r - 1) % n)
        dist.recv(chunk, (r - 1) % n) if r % 2 == 0 else dist.send(chunk, (r + 1) % n)
    return sum(_data(k, n) for k in range(n))  # the check's inputs, from labkit's code
"""
PATCHES_COUNTERS = """import torch.distributed as dist
from labkit import check
def ring_all_reduce(ctx, tensor):
    dist.all_reduce(tensor)
    n, size = ctx.world_size, tensor.nbytes
    check.wire.Traffic.to_dict = lambda self: {"sent_bytes": 2 * (n - 1) * size // n,
        "largest_send": size // n, "collectives": {}}
    return tensor
"""


def test_answers_that_reach_into_the_checks_are_flagged_for_review():
    from labkit.classroom.answers import review_notes
    from tests.exercises import answer_source

    assert "labkit.check" in review_notes(PREDICTS)
    assert review_notes(PATCHES_COUNTERS)
    assert review_notes("import gc\nf = sys._getframe(1).f_locals") == ["gc", "_getframe",
                                                                          "f_locals"]
    for notebook, answer in [("00_your_cluster", "ring_all_reduce_answer"),
                             ("04_tensor_parallel", "tensor_parallel_linears_answer")]:
        assert review_notes(answer_source(notebook, answer)) == [], notebook
