"""``%%ranks cluster`` in a real kernel: a small notebook run by nbclient (one kernel, two
ranks), its outputs read back cell by cell."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import labkit

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")

CELLS = [
    "%load_ext labkit\nimport labkit\ncluster = labkit.Cluster(2, device='cpu', progress=False)",
    # 1: an AllReduce, printed on each rank; the last expression's value comes back per rank
    "%%ranks cluster\ntotal = torch.tensor([float(ctx.rank + 1)])\ndist.all_reduce(total)\n"
    "print(f'total {total.item()} on rank {ctx.rank}')\ntotal.item()",
    # 2: a name the first cell defined, still on each rank; --out stores the values here
    "%%ranks cluster --out doubled\ntotal.item() * 2",
    "doubled, type(doubled).__name__",
    # 4: a failure on rank 1, its line quoted from the cell
    "%%ranks cluster\nif ctx.rank == 1:\n    raise ValueError('bad batch')\nctx.rank",
    # 5: the ranks restarted: the first cell's names are gone, and the error says so
    "%%ranks cluster\ntotal",
    # 6: the restarted ranks run the next cell
    "%%ranks cluster\nctx.world_size",
    # 7: statements only: nothing shown, prints still under their rank
    "%%ranks cluster\nprint('hello')",
    "cluster.close()",
]
RAISES = {4, 5}


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in CELLS]
    for index in RAISES:
        nb.cells[index].metadata["tags"] = ["raises-exception"]
    path = tmp_path_factory.mktemp("ranks")
    env = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env]))  # this labkit
    try:
        NotebookClient(nb, kernel_name="python3", timeout=120,
                       resources={"metadata": {"path": str(path)}}).execute()
    finally:
        if env is None:
            os.environ.pop("PYTHONPATH")
        else:
            os.environ["PYTHONPATH"] = env
    return nb


def _text(cell, kind: str) -> str:
    return ANSI.sub("", "".join(o.get("text", "") for o in cell.outputs
                                if o.output_type == "stream" and o.name == kind))


def _result(cell) -> str | None:
    values = [o.data["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]
    return values[0] if values else None


def _error(cell):
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert errors, cell.outputs
    return errors[0].ename, ANSI.sub("", errors[0].evalue + "\n".join(errors[0].traceback))


def test_the_cell_runs_on_every_rank_and_its_prints_appear_under_each_rank(executed):
    out = _text(executed.cells[1], "stdout")
    assert "[rank 0] total 3.0 on rank 0" in out and "[rank 1] total 3.0 on rank 1" in out
    assert _result(executed.cells[1]) == "[3.0, 3.0]"


def test_names_a_cell_defines_are_kept_on_each_rank_for_the_next_cell(executed):
    assert _result(executed.cells[2]) == "[6.0, 6.0]"
    assert _result(executed.cells[3]) == "([6.0, 6.0], 'RunResults')"


def test_a_failure_raises_rank_error_with_the_rank_and_the_cells_line(executed):
    ename, text = _error(executed.cells[4])
    assert ename == "RankError"
    assert "rank 1: ValueError: bad batch" in text
    assert 'File "<%%ranks cell 5>", line 3' in text and "raise ValueError('bad batch')" in text
    assert "names that %%ranks cells defined on them" in text


def test_after_a_restart_the_names_are_gone_and_the_error_says_why(executed):
    ename, text = _error(executed.cells[5])
    assert ename == "RankError" and "NameError: name 'total' is not defined" in text
    assert "the ranks restarted since the last %%ranks cell" in text
    assert _result(executed.cells[6]) == "[2, 2]"
    assert not _text(executed.cells[6], "stderr")


def test_a_cell_without_a_last_expression_shows_only_what_the_ranks_print(executed):
    cell = executed.cells[7]
    assert _result(cell) is None
    assert "[rank 0] hello" in _text(cell, "stdout") and "[rank 1] hello" in _text(cell, "stdout")


@pytest.mark.parametrize("out", ["1bad", "a.b", "class"])
def test_out_that_is_not_a_python_name_is_refused_before_anything_runs(out):
    """The values would land under a key no cell can name; nothing is sent to the ranks."""
    from IPython.core.error import UsageError

    from labkit.runtime.cluster.magic import RanksCells

    cells = RanksCells({})
    with pytest.raises(UsageError, match="is not a Python name"):
        cells.run(f"cluster --out {out}", "ctx.rank")
    assert out not in cells.user_ns


def test_the_note_on_lost_names_comes_only_when_the_ranks_stopped(two):
    """A timeout stops the ranks (the note says the names are gone); a result the notebook
    cannot rebuild leaves them up with their names (no such note)."""
    from labkit.runtime.cluster.errors import RankError, RunTimeout
    from labkit.runtime.cluster.magic import FAILURE_NOTE, RanksCells

    cells = RanksCells({"cluster": two})
    with pytest.raises(RunTimeout) as stopped:
        cells.run("cluster --timeout 1", "while True:\n    pass")
    assert FAILURE_NOTE in stopped.value.__notes__
    cells.run("cluster", "kept = 41")
    unbuildable = "class Bad:\n    def __reduce__(self):\n        return int, ('x',)\nBad()"
    with pytest.raises(RankError) as kept_up:
        cells.run("cluster", unbuildable)
    assert not kept_up.value.restarted
    assert FAILURE_NOTE not in getattr(kept_up.value, "__notes__", [])
    assert cells.run("cluster", "kept + 1") == [42, 42]


def _run(kc, code: str, timeout: float = 60) -> tuple[dict, str]:
    """Execute ``code`` in the kernel; (its reply's content, the text it printed)."""
    msg_id = kc.execute(code)
    reply = _reply(kc, msg_id, timeout)
    return reply["content"], _printed(kc, msg_id)


def _reply(kc, msg_id: str, timeout: float) -> dict:
    """The shell reply to ``msg_id``: a kernel_info reply still queued from the kernel's
    start (``wait_for_ready`` may ask more than once on a busy machine) is passed over."""
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply
        assert reply["msg_type"] == "kernel_info_reply", reply


def _printed(kc, msg_id: str) -> str:
    text = []
    while True:
        msg = kc.get_iopub_msg(timeout=10)
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        elif msg["msg_type"] == "execute_result":
            text.append(msg["content"]["data"]["text/plain"])
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            return "".join(text)


def test_interrupting_a_ranks_cell_stops_it_and_the_next_cell_runs(monkeypatch, tmp_path):
    """The kernel's stop button during a %%ranks cell: KeyboardInterrupt in the notebook, no
    hung kernel, and fresh ranks for the next cell (cluster.run's own recovery)."""
    from jupyter_client.manager import start_new_kernel

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    km, kc = start_new_kernel(kernel_name="python3", cwd=str(tmp_path))
    try:
        reply, _ = _run(kc, CELLS[0])
        assert reply["status"] == "ok", reply
        msg_id = kc.execute("%%ranks cluster\nimport time\nprint('started', flush=True)\n"
                            "time.sleep(120)")
        started = ""
        while "[rank 1] started" not in started or "[rank 0] started" not in started:
            msg = kc.get_iopub_msg(timeout=30)
            if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
                started += msg["content"]["text"]
        km.interrupt_kernel()
        reply = _reply(kc, msg_id, 30)["content"]
        assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
        reply, printed = _run(kc, "%%ranks cluster\nctx.rank", timeout=60)
        assert reply["status"] == "ok", reply
        assert "[0, 1]" in printed
        _run(kc, "cluster.close()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_the_graders_checker_runs_ranks_cells_as_a_kernel_does(two):
    """The checker grades notebook 00 outside a kernel: its get_ipython() runs
    %load_ext labkit and %%ranks, and refuses every other magic."""
    from labkit.classroom.checker import _Shell

    namespace = {"cluster": two}
    shell = _Shell(namespace)
    with pytest.raises(RuntimeError, match="after %load_ext labkit"):
        shell.run_cell_magic("ranks", "cluster", "ctx.rank")
    shell.run_line_magic("load_ext", "labkit")
    assert shell.run_cell_magic("ranks", "cluster --out seen", "ctx.rank") == [0, 1]
    assert namespace["seen"] == [0, 1]
    with pytest.raises(RuntimeError, match="does not run in the grader"):
        shell.run_line_magic("pip", "install something")
    # each cell has a name of its own, so a function an earlier cell defined quotes its line
    shell.run_cell_magic("ranks", "cluster", "def inverse(x):\n    return 1 / x")
    with pytest.raises(labkit.RankError) as failed:
        shell.run_cell_magic("ranks", "cluster", "zero = 0\nother = 1\ninverse(zero)")
    assert "return 1 / x" in str(failed.value) and "other = 1\n" not in str(failed.value)
