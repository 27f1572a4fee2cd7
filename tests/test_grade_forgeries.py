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


# Two forgeries of the ring check's measurements, from the ranks themselves. PREDICTS computes
# every rank's input instead of receiving it (from the fixed seeds the check once used, or
# from its own seed taken as the base of its peers'), with chunk-sized sends of zeros for the
# byte count. PATCHES_TO_DICT sums with dist.all_reduce and makes labkit's counter report a
# ring; PATCHES_COUNTERS sends every rank's whole tensor to every other rank and then sets
# the counter's fields to a ring's. The check's private seeds and the kernel's socket counts
# catch each (the last at the second rank count: on 2 ranks it sends as much as a ring).
PREDICTS = """import sys, torch, torch.distributed as dist
def ring_all_reduce(ctx, tensor):
    n, r, chunk = ctx.world_size, ctx.rank, torch.zeros(tensor.numel() // ctx.world_size)
    for _ in range(2 * (n - 1)):  # chunk-sized sends of nothing, for the byte count
        dist.send(chunk, (r + 1) % n) if r % 2 == 0 else dist.recv(chunk, (r - 1) % n)
        dist.recv(chunk, (r - 1) % n) if r % 2 == 0 else dist.send(chunk, (r + 1) % n)
    frame, own = sys._getframe(1), None
    while frame is not None and not isinstance(own, int):
        own, frame = frame.f_locals.get("seed"), frame.f_back
    guesses = [[1_000 + k for k in range(n)]]
    guesses += [[own - r + k for k in range(n)]] if isinstance(own, int) else []
    for seeds in guesses:
        data = [torch.randint(-8, 9, (tensor.numel(),),
                              generator=torch.Generator().manual_seed(s)).float() for s in seeds]
        if torch.equal(data[r], tensor):  # the guess gives this rank's own input
            return sum(data)
    return sum(data)
"""
PATCHES_TO_DICT = """import torch.distributed as dist
from labkit.lessons.exercise import wire
def ring_all_reduce(ctx, tensor):
    n, size = ctx.world_size, tensor.nbytes
    ring = {"sent_bytes": 2 * (n - 1) * size // n, "received_bytes": 2 * (n - 1) * size // n,
            "sends": 2 * (n - 1), "recvs": 2 * (n - 1), "largest_send": size // n,
            "collectives": {}}
    wire.Traffic.to_dict = lambda self: dict(ring)
    dist.all_reduce(tensor)
    return tensor
"""
PATCHES_COUNTERS = """import sys, torch, torch.distributed as dist
def ring_all_reduce(ctx, tensor):
    n, r = ctx.world_size, ctx.rank
    total, incoming = tensor.clone(), torch.empty_like(tensor)
    for k in range(n):  # rank k sends its whole tensor to every other rank
        for peer in range(n):
            if k == r and peer != r:
                dist.send(tensor, peer)
        if k != r:
            dist.recv(incoming, k)
            total += incoming
    frame = sys._getframe(1)
    while "traffic" not in frame.f_locals:
        frame = frame.f_back
    counter = frame.f_locals["traffic"]
    counter.sent_bytes = counter.received_bytes = 2 * (n - 1) * tensor.nbytes // n
    counter.sends = counter.recvs = 2 * (n - 1)
    counter.largest_send = tensor.nbytes // n
    return tensor.copy_(total)
"""


def test_forged_measurements_earn_nothing(tmp_path):
    folder = tmp_path / "submissions"
    submission(folder / "predicts.ipynb", PREDICTS)
    submission(folder / "patches_to_dict.ipynb", PATCHES_TO_DICT)
    submission(folder / "patches_counters.ipynb", PATCHES_COUNTERS)
    rows = grade_folder(folder, tmp_path / "grades.csv")
    for name in ("predicts", "patches_to_dict", "patches_counters"):
        assert rows[name]["points"] == "0", (name, rows[name])
        assert rows[name]["exercise:ring_all_reduce_check"] == "failed", (name, rows[name])
        assert rows[name]["status"] == "graded", (name, rows[name]["detail"])
        assert rows[name]["review"], name  # each reaches into the checks: flagged too
    assert "missing contributions" in rows["predicts"]["detail"], rows["predicts"]
    for name in ("patches_to_dict", "patches_counters"):
        assert "reported are not what crossed its sockets" in rows[name]["detail"], rows[name]
    assert "on 4 ranks (it passed on 2" in rows["patches_counters"]["detail"]


def test_answers_that_reach_into_the_checks_are_flagged_for_review():
    from labkit.classroom.answers import review_notes
    from tests.exercises import answer_source

    assert "_getframe" in review_notes(PREDICTS)
    assert "labkit.lessons.exercise" in review_notes(PATCHES_TO_DICT)
    assert "f_locals" in review_notes(PATCHES_COUNTERS)
    assert review_notes("import gc\nf = sys._getframe(1).f_locals") == ["gc", "_getframe",
                                                                          "f_locals"]
    for notebook, answer in [("00_your_cluster", "ring_all_reduce_answer"),
                             ("04_tensor_parallel", "tensor_parallel_linears_answer")]:
        assert review_notes(answer_source(notebook, answer)) == [], notebook
