"""Failure is a first-class path: every way a rank can fail is reported fast, leaves no
process behind, and the next run works on fresh ranks."""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time

import pytest
import torch
import torch.distributed as dist

import labkit
from tests.conftest import wait_gone

REPORT_WITHIN_S = 10.0


@pytest.fixture
def cluster3():
    with labkit.Cluster(3, device="cpu", progress=False) as cluster:
        yield cluster


def _pids(cluster):
    return cluster.run(lambda ctx: os.getpid())


def _fails_and_recovers(cluster, fn, expected):
    """Run ``fn``, expect ``expected`` quickly, check the old ranks are gone, run again."""
    pids = _pids(cluster)
    start = time.monotonic()
    with pytest.raises(expected) as info:
        cluster.run(fn)
    assert time.monotonic() - start < REPORT_WITHIN_S
    assert wait_gone(pids, timeout=0.5) == set(), "old ranks still alive after the error"
    assert cluster.run(lambda ctx: ctx.rank) == [0, 1, 2]
    assert set(_pids(cluster)).isdisjoint(pids)
    return info.value


def _raise_on_rank_1_while_others_wait(ctx):
    if ctx.rank == 1:
        raise ValueError("bad batch on rank 1")
    dist.all_reduce(torch.ones(1))  # ranks 0 and 2 block here: rank 1 never joins


def test_exception_while_others_block_in_a_collective(cluster3):
    error = _fails_and_recovers(cluster3, _raise_on_rank_1_while_others_wait, labkit.RankError)
    assert error.rank == 1
    assert isinstance(error.exception, ValueError)
    assert "bad batch on rank 1" in str(error)
    assert "_raise_on_rank_1_while_others_wait" in error.remote_traceback
    assert "Remote traceback (rank 1)" in str(error)


def test_rank_that_exits_is_reported_with_its_exit_code(cluster3):
    def exit_on_rank_2(ctx):
        if ctx.rank == 2:
            os._exit(3)
        dist.all_reduce(torch.ones(1))

    error = _fails_and_recovers(cluster3, exit_on_rank_2, labkit.RankError)
    assert error.rank == 2 and error.exitcode == 3
    assert "exit code 3" in str(error)


def test_rank_that_segfaults_is_reported(cluster3):
    def segfault_on_rank_0(ctx):
        if ctx.rank == 0:
            os.kill(os.getpid(), signal.SIGSEGV)
        dist.all_reduce(torch.ones(1))

    error = _fails_and_recovers(cluster3, segfault_on_rank_0, labkit.RankError)
    assert error.rank == 0 and error.exitcode == -signal.SIGSEGV
    assert "SIGSEGV" in str(error)


def test_rank_killed_from_outside_is_reported(cluster3):
    victim = _pids(cluster3)[1]
    threading.Timer(0.5, os.kill, (victim, signal.SIGKILL)).start()
    error = _fails_and_recovers(cluster3, lambda ctx: time.sleep(60), labkit.RankError)
    assert error.rank == 1 and error.exitcode == -signal.SIGKILL


def test_timeout_stops_the_ranks(cluster3):
    pids = _pids(cluster3)
    start = time.monotonic()
    with pytest.raises(labkit.RunTimeout, match="within 1"):
        cluster3.run(lambda ctx: time.sleep(60), timeout=1)
    assert time.monotonic() - start < 1 + REPORT_WITHIN_S
    assert wait_gone(pids, timeout=0.5) == set()
    assert cluster3.run(lambda ctx: ctx.rank, timeout=30) == [0, 1, 2]


def test_keyboard_interrupt_stops_the_ranks(cluster3):
    pids = _pids(cluster3)
    threading.Timer(0.5, _thread.interrupt_main).start()
    with pytest.raises(KeyboardInterrupt):
        cluster3.run(lambda ctx: time.sleep(60))
    assert wait_gone(pids, timeout=0.5) == set()
    assert cluster3.run(lambda ctx: ctx.rank) == [0, 1, 2]


def test_unpicklable_result_is_a_rank_error(cluster3):
    error = _fails_and_recovers(cluster3, lambda ctx: threading.Lock(), labkit.RankError)
    assert "cannot be sent back" in str(error)
