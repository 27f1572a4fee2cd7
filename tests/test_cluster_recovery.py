"""Whatever happens between or during runs, the next run works: ranks killed from outside
(the OOM killer), a timer left by user code, the launcher killed, a child forked by the
notebook, Ctrl-C while a large argument is still being sent, close() from another thread."""

from __future__ import annotations

import atexit
import os
import signal
import threading
import time

import pytest

import labkit
from tests.conftest import wait_gone


@pytest.fixture
def cluster3():
    with labkit.Cluster(3, device="cpu", progress=False) as cluster:
        yield cluster


def _pids(cluster) -> list[int]:
    return cluster.run(lambda ctx: os.getpid(), timeout=30)


def test_rank_killed_between_runs_is_named_and_replaced(cluster3):
    old = _pids(cluster3)
    os.kill(old[1], signal.SIGKILL)
    assert wait_gone([old[1]], timeout=5) == set()
    with pytest.warns(labkit.RanksRestartedWarning, match=r"rank 1 .*SIGKILL"):
        assert cluster3.run(lambda ctx: ctx.rank, timeout=30) == [0, 1, 2]
    new = _pids(cluster3)
    assert set(new).isdisjoint(old) and [r["pid"] for r in cluster3.ranks] == new
    assert wait_gone(old, timeout=5) == set()


def test_timer_left_by_user_code_kills_a_rank_after_its_run(cluster3):
    def leave_a_timer(ctx):
        if ctx.rank == 2:
            threading.Timer(0.2, os._exit, (7,)).start()

    cluster3.run(leave_a_timer)
    time.sleep(1.0)
    with pytest.warns(labkit.RanksRestartedWarning, match=r"rank 2 .*exit code 7"):
        assert cluster3.run(lambda ctx: ctx.world_size, timeout=30) == [3, 3, 3]


def test_launcher_killed_between_runs_is_replaced(cluster3):
    old = _pids(cluster3)
    zygote = cluster3._procs.zygote.pid
    os.kill(zygote, signal.SIGKILL)
    assert wait_gone([zygote, *old], timeout=5) == set()  # ranks die with their launcher
    with pytest.warns(labkit.RanksRestartedWarning, match="launcher"):
        assert cluster3.run(lambda ctx: ctx.rank, timeout=60) == [0, 1, 2]
    assert cluster3._procs.zygote.pid != zygote


def test_a_child_forked_by_the_notebook_leaves_the_cluster_alone(cluster3):
    old = _pids(cluster3)
    pid = os.fork()
    if pid == 0:  # a plain child that ends the way an interpreter ends: exit handlers run
        try:
            atexit._run_exitfuncs()
        finally:
            os._exit(0)
    assert os.waitpid(pid, 0)[1] == 0
    with warnings_as_errors():
        assert _pids(cluster3) == old  # the same ranks: nothing was killed or restarted


class warnings_as_errors:
    def __enter__(self):
        import warnings

        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("error", labkit.RanksRestartedWarning)

    def __exit__(self, *exc):
        self._catch.__exit__(*exc)


def test_interrupt_in_the_middle_of_sending_a_large_argument(cluster3, monkeypatch):
    """Ctrl-C lands after part of the job reached one rank: that rank must not wait for
    the rest of it forever, nor read the next job as its continuation."""
    big = b"x" * (64 * 2**20)
    pids = _pids(cluster3)
    handle = cluster3._procs.ranks[1]
    send_bytes = handle.conn.send_bytes

    def half_then_interrupt(data):
        header = len(data).to_bytes(4, "big")  # multiprocessing's framing, then half the body
        os.write(handle.conn.fileno(), header + bytes(data[:len(data) // 2]))
        raise KeyboardInterrupt

    monkeypatch.setattr(handle.conn, "send_bytes", half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        cluster3.run(lambda ctx, blob: len(blob), big)
    monkeypatch.setattr(handle.conn, "send_bytes", send_bytes)
    assert wait_gone(pids, timeout=5) == set()
    assert cluster3.run(lambda ctx, blob: len(blob), big, timeout=60) == [len(big)] * 3


def test_interrupt_while_ranks_start(monkeypatch):
    from labkit.runtime.cluster import cluster as cluster_module

    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        cluster.run(lambda ctx: None)
        real = cluster_module.Cluster._await_ready

        def interrupted(self, deadline):
            raise KeyboardInterrupt

        monkeypatch.setattr(cluster_module.Cluster, "_await_ready", interrupted)
        with pytest.raises(KeyboardInterrupt):
            cluster.resize(3)
        assert cluster._procs.ranks == []  # nothing half-started is left
        monkeypatch.setattr(cluster_module.Cluster, "_await_ready", real)
        assert cluster.run(lambda ctx: ctx.world_size, timeout=30) == [3, 3, 3]


def test_close_from_another_thread_ends_a_blocked_run_clearly():
    cluster = labkit.Cluster(2, device="cpu", progress=False)
    pids = _pids(cluster)
    threading.Timer(0.5, cluster.close).start()
    with pytest.raises(labkit.ClusterError, match="closed while this run"):
        cluster.run(lambda ctx: time.sleep(60))
    assert wait_gone(pids, timeout=5) == set()
    with pytest.raises(labkit.ClusterError, match="closed"):
        cluster.run(lambda ctx: None)


def test_resize_after_close_is_refused():
    cluster = labkit.Cluster(1, device="cpu", progress=False)
    zygote = cluster._procs.zygote.pid
    cluster.close()
    with pytest.raises(labkit.ClusterError, match="closed"):
        cluster.resize(2)
    assert cluster._procs.ranks == [] and wait_gone([zygote], timeout=5) == set()


def test_timeout_counts_the_wait_for_another_run(cluster3):
    worker = threading.Thread(target=cluster3.run, args=(lambda ctx: time.sleep(3),))
    worker.start()
    time.sleep(0.3)
    start = time.monotonic()
    with pytest.raises(labkit.RunTimeout, match="another run"):
        cluster3.run(lambda ctx: None, timeout=1)
    assert time.monotonic() - start < 2.5
    worker.join()
    assert cluster3.run(lambda ctx: ctx.rank) == [0, 1, 2]  # the first run was not harmed


@pytest.mark.parametrize("timeout, error", [("5", TypeError), (0, ValueError),
                                            (-1, ValueError), (float("nan"), ValueError),
                                            (True, TypeError)])
def test_bad_timeouts_are_refused_before_anything_is_sent(cluster3, timeout, error):
    pids = _pids(cluster3)
    job = cluster3._job_id
    with pytest.raises(error, match="timeout"):
        cluster3.run(lambda ctx: None, timeout=timeout)
    assert cluster3._job_id == job and _pids(cluster3) == pids


def test_run_timeout_names_the_rank_that_held_it_up(cluster3):
    import torch
    import torch.distributed as dist

    def rank_1_is_slow(ctx):
        if ctx.rank == 1:
            time.sleep(60)
        dist.all_reduce(torch.ones(1))

    with pytest.raises(labkit.RunTimeout) as info:
        cluster3.run(rank_1_is_slow, timeout=1.5)
    error = info.value
    assert error.ranks == (1,) and error.waiting == (0, 2)
    assert "rank 1 held it up" in str(error)
    assert error.where[1].startswith("running") and "rank_1_is_slow" in error.where[1]
    assert "all_reduce" in error.where[0] and "all_reduce" in error.where[2]
    assert cluster3.run(lambda ctx: ctx.rank, timeout=30) == [0, 1, 2]
