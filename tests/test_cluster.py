"""Cluster basics: validation before any process starts, running, results, reuse."""

from __future__ import annotations

import logging
import os
import time

import pytest
import torch
import torch.distributed as dist

import labkit
from tests.conftest import descendants


@pytest.mark.parametrize("world_size, device, error", [
    (0, "cpu", ValueError),
    (-2, "auto", ValueError),
    (2.5, "cpu", TypeError),
    (True, "cpu", TypeError),
    (2, "tpu", ValueError),
])
def test_bad_arguments_fail_before_any_process_starts(world_size, device, error):
    before = descendants()
    with pytest.raises(error):
        labkit.Cluster(world_size, device=device)
    assert descendants() == before


@pytest.mark.skipif(torch.cuda.is_available(),
                    reason="with GPUs, more ranks than GPUs share them (tests/test_gpu.py)")
def test_gpu_ranks_without_a_gpu_are_a_clear_error():
    before = descendants()
    with pytest.raises(ValueError, match="GPU") as info:
        labkit.Cluster(64, device="cuda")
    assert "device='cpu'" in str(info.value)
    assert descendants() == before


def _main_defined(source: str):
    """Compile ``source`` as if typed in a notebook cell (module ``__main__``)."""
    namespace = {"__name__": "__main__"}
    exec(compile(source, "<notebook-cell>", "exec"), namespace)
    return namespace


def test_function_from_main_all_reduces_rank_ids_on_four_ranks():
    cell = _main_defined(
        "import torch, torch.distributed as dist\n"
        "def total_of_ranks(ctx):\n"
        "    t = torch.tensor([ctx.rank])\n"
        "    dist.all_reduce(t)\n"
        "    return t.item()\n")
    assert cell["total_of_ranks"].__module__ == "__main__"
    with labkit.Cluster(4, device="cpu", progress=False) as cluster:
        results = cluster.run(cell["total_of_ranks"])
    assert results == [6, 6, 6, 6]
    assert results.world_size == 4 and results.backend == "gloo"


def test_context_describes_each_rank(two):
    infos = two.run(lambda ctx: (ctx.rank, ctx.world_size, str(ctx.device), ctx.backend,
                                      torch.get_num_threads(), dist.get_rank(ctx.group)))
    assert infos == [(0, 2, "cpu", "gloo", 1, 0), (1, 2, "cpu", "gloo", 1, 1)]
    assert [r["rank"] for r in two.ranks] == [0, 1]
    assert "<table>" in two._repr_html_()


def test_arguments_results_and_state_persist_across_runs(two):
    def keep(ctx, value, *, scale):
        ctx.state["kept"] = value * scale + ctx.rank
        return torch.full((2,), float(ctx.rank))

    tensors = two.run(keep, 10, scale=3)
    assert [t.tolist() for t in tensors] == [[0.0, 0.0], [1.0, 1.0]]
    assert two.run(lambda ctx: ctx.state["kept"]) == [30, 31]


def test_ranks_are_reused_between_runs(two):
    pids = two.run(lambda ctx: __import__("os").getpid())
    start = time.monotonic()
    for _ in range(10):
        two.run(lambda ctx: None)
    per_run = (time.monotonic() - start) / 10
    assert two.run(lambda ctx: __import__("os").getpid()) == pids
    assert per_run < 0.5  # no process start-up, no init_process_group


def test_unpicklable_arguments_are_refused_in_the_notebook(two):
    import threading

    with pytest.raises(TypeError, match="cannot send"):
        two.run(lambda ctx, lock: None, threading.Lock())
    with pytest.raises(TypeError, match="needs a function"):
        two.run(42)
    assert two.run(lambda ctx: ctx.rank) == [0, 1]


def test_prints_on_ranks_reach_the_notebook(two, capsys):
    two.run(lambda ctx: print(f"hello from {ctx.rank}"))
    out = capsys.readouterr().out
    assert "[rank 0] hello from 0" in out and "[rank 1] hello from 1" in out


def test_progress_is_shown_while_running(capsys):
    def work(ctx, steps):
        for step in range(steps):
            time.sleep(0.01)
            ctx.progress(step + 1, steps, "training")
        return steps

    with labkit.Cluster(2, device="cpu") as cluster:
        assert cluster.run(work, 20) == [20, 20]
    err = capsys.readouterr().err
    assert "training" in err and "20/20" in err


def test_a_listener_hears_only_the_runs_its_own_thread_starts(two):
    """A widget's background thread listens (notebook 10's kill button acts on what it
    hears): a run another cell starts meanwhile must not reach it."""
    import threading

    heard, listening, leave = [], threading.Event(), threading.Event()

    def widget():
        with two.listening(lambda *report: heard.append(report)):
            listening.set()
            leave.wait(60)

    thread = threading.Thread(target=widget)
    thread.start()
    listening.wait(60)
    try:
        two.run(lambda ctx: ctx.progress(1, 1, "another cell"))
    finally:
        leave.set()
        thread.join()
    assert heard == []
    with two.listening(lambda *report: heard.append(report)):
        two.run(lambda ctx: ctx.progress(1, 1, "mine"))
    assert sorted(heard) == [(0, 1, 1, "mine"), (1, 1, 1, "mine")]


def test_oversubscription_is_warned_and_reported():
    from labkit.runtime.cluster.hardware import physical_cores

    ranks = physical_cores() + 1
    with pytest.warns(labkit.OversubscriptionWarning, match="physical cores"):
        cluster = labkit.Cluster(ranks, device="cpu", progress=False)
    with cluster:
        results = cluster.run(lambda ctx: ctx.oversubscribed)
    assert results == [True] * ranks and results.oversubscribed


def test_resize_keeps_the_launcher_and_changes_world_size():
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        zygote = cluster._procs.zygote.pid
        cluster.resize(3)
        assert cluster.run(lambda ctx: ctx.world_size) == [3, 3, 3]
        assert cluster._procs.zygote.pid == zygote


def test_closed_cluster_refuses_to_run():
    cluster = labkit.Cluster(1, device="cpu", progress=False)
    cluster.close()
    cluster.close()  # twice is fine
    with pytest.raises(labkit.ClusterError, match="closed"):
        cluster.run(lambda ctx: None)


# A logger with a file handler opened in the notebook before the cluster starts (as pytest's
# log-file handler is, and as ``logging.basicConfig(filename=...)`` would be in a notebook).
_STALE_LOG = logging.getLogger("labkit.tests.stale")


def _open_files_then_log(ctx, stale_fd: int, folder: str) -> list[str]:
    """Open files on the rank until the numbers pass ``stale_fd``, then log through the
    notebook's handler: the record must not land in any of them."""
    files = []
    while not files or files[-1].fileno() <= stale_fd + 1:
        files.append(open(os.path.join(folder, f"rank{ctx.rank}-{len(files)}"), "w"))
    _STALE_LOG.warning("written through the notebook's handler")
    for handler in _STALE_LOG.handlers:
        handler.flush()
    for file in files:
        file.close()
    return [file.name for file in files]


def test_a_descriptor_the_notebook_holds_is_never_reused_on_a_rank(tmp_path):
    """The forked launcher lets go of the notebook's descriptors but keeps their numbers
    taken: a log record written on a rank through a handler the notebook opened must not end
    up in a socket or file the rank opened later (it once landed in gloo's socket and hung
    ``dcp.save``)."""
    handler = logging.FileHandler(tmp_path / "notebook.log")
    _STALE_LOG.addHandler(handler)
    try:
        with labkit.Cluster(2, device="cpu", progress=False, launcher="fork") as cluster:
            paths = cluster.run(_open_files_then_log, handler.stream.fileno(), str(tmp_path))
    finally:
        _STALE_LOG.removeHandler(handler)
        handler.close()
    written = [path for rank in paths for path in rank if "notebook" in open(path).read()]
    assert written == []
    assert "written through" not in (tmp_path / "notebook.log").read_text()
