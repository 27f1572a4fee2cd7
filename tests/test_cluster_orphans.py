"""No orphans: however the notebook's process ends, no rank or launcher survives it."""

from __future__ import annotations

import gc
import json
import os
import signal
import subprocess
import sys
import textwrap

import labkit
from tests.conftest import alive, descendants, wait_gone

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _cluster_pids(cluster) -> set[int]:
    return {cluster._procs.zygote.pid, *cluster.run(lambda ctx: os.getpid())}


def test_close_leaves_no_process():
    before = descendants()
    cluster = labkit.Cluster(2, device="cpu", progress=False)
    pids = _cluster_pids(cluster)
    assert pids <= descendants()
    cluster.close()
    assert wait_gone(pids, timeout=0.5) == set()
    assert descendants() == before


def test_garbage_collection_leaves_no_process():
    cluster = labkit.Cluster(2, device="cpu", progress=False)
    pids = _cluster_pids(cluster)
    del cluster
    gc.collect()
    assert wait_gone(pids, timeout=5) == set()


def _script(body: str) -> subprocess.Popen:
    """Start a Python process that plays the notebook kernel and prints its cluster's pids."""
    code = textwrap.dedent("""
        import json, os, sys, time
        import labkit
        cluster = labkit.Cluster(2, device="cpu", progress=False)
        pids = [cluster._procs.zygote.pid, *cluster.run(lambda ctx: os.getpid())]
        print(json.dumps(pids), flush=True)
    """) + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)


def test_normal_exit_without_close_leaves_no_process():
    proc = _script("")  # the interpreter simply ends
    pids = json.loads(proc.stdout.readline())
    assert proc.wait(timeout=60) == 0
    assert wait_gone(pids, timeout=5) == set()


def test_sigkilled_kernel_leaves_no_process_even_while_ranks_are_busy():
    proc = _script("""
        import threading
        threading.Thread(target=cluster.run, args=(lambda ctx: time.sleep(600),),
                         daemon=True).start()
        time.sleep(600)
    """)
    pids = json.loads(proc.stdout.readline())
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert wait_gone(pids, timeout=10) == set()


def _start_children(ctx) -> list[int]:
    """A child in the rank's process group, one that left it (setsid), a multiprocessing one."""
    import multiprocessing
    import subprocess
    import time

    grouped = subprocess.Popen(["sleep", "600"])
    escaped = subprocess.Popen(["sleep", "600"], start_new_session=True)
    forked = multiprocessing.get_context("fork").Process(target=time.sleep, args=(600,))
    forked.start()
    ctx.state["children"] = (grouped, escaped, forked)
    return [grouped.pid, escaped.pid, forked.pid]


def test_processes_started_on_a_rank_die_with_the_cluster():
    cluster = labkit.Cluster(2, device="cpu", progress=False)
    children = [pid for pids in cluster.run(_start_children) for pid in pids]
    assert all(alive(pid) for pid in children)
    cluster.close()
    assert wait_gone(children, timeout=5) == set()


def test_processes_started_on_a_rank_die_when_the_ranks_restart(two):
    children = [pid for pids in two.run(_start_children) for pid in pids]
    try:
        two.run(lambda ctx: 1 / 0)
    except labkit.RankError:
        pass
    assert wait_gone(children, timeout=5) == set()
    assert two.run(lambda ctx: ctx.rank) == [0, 1]


def test_sigkilled_kernel_takes_what_ranks_started_with_it():
    proc = _script("""
        from tests.test_cluster_orphans import _start_children
        children = [p for pids in cluster.run(_start_children) for p in pids]
        print(json.dumps(children), flush=True)
        time.sleep(600)
    """)
    pids = json.loads(proc.stdout.readline()) + json.loads(proc.stdout.readline())
    assert all(alive(pid) for pid in pids)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)
    assert wait_gone(pids, timeout=10) == set()
