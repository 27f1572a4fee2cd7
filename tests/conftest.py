"""Shared fixtures: warm clusters, checks that no rank outlives its test, and the parity
assertion of runs that must train as one device."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

# An editable install of another checkout (the shared venv's) puts a finder on sys.meta_path
# that serves every labkit.<name> this checkout lacks from that checkout: a test or notebook
# still naming a moved module would import the other checkout's code and pass. Here only this
# checkout's labkit can be imported (subprocesses keep the venv's finder).
sys.meta_path[:] = [finder for finder in sys.meta_path
                    if not getattr(finder, "__module__", "").startswith("__editable___labkit")]

import labkit  # noqa: E402 - after the finder is gone

# The tests that press the kernel's stop button (SIGINT, ``_thread.interrupt_main``) need
# Python's own SIGINT handler. A shell that starts pytest in the background without job
# control (``pytest ... &`` in a script, nohup) has it ignored, and Python keeps an ignored
# SIGINT ignored: every such test would then wait out its run instead.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

assert Path(labkit.__file__).resolve().parent.parent == Path(__file__).resolve().parent.parent, \
    f"labkit is imported from {labkit.__file__}, not from this checkout"


def descendants() -> set[int]:
    """Pids of every live (non-zombie) process below this one."""
    alive = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                alive.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pids, timeout: float = 10.0) -> set[int]:
    """Wait until none of ``pids`` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    left = set(pids)
    while left and time.monotonic() < deadline:
        left = {p for p in left if alive(p)}
        time.sleep(0.05)
    return left


@pytest.fixture(scope="module")
def one():
    """A warm 1-rank CPU cluster, shared by a test module."""
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def two():
    """A warm 2-rank CPU cluster, shared by a test module."""
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        yield cluster


@pytest.fixture
def fresh():
    """A 2-rank CPU cluster for one test: a forgery's patches stay on its ranks."""
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def four():
    """A warm 4-rank CPU cluster, shared by a test module (oversubscribed on a 2-core
    machine: slower, still right)."""
    with labkit.Cluster(4, device="cpu", progress=False) as cluster:
        yield cluster


def assert_trains_as(reference, report) -> None:
    """The same training as ``reference``: losses step by step (rtol 1e-5) and rank 0's final
    weights (rtol 1e-4, atol 1e-6; SGD, whose update is linear in the gradient)."""
    torch.testing.assert_close(report.losses, reference.losses, rtol=1e-5, atol=0)
    for name, weight in reference.ranks[0]["weights"].items():
        torch.testing.assert_close(report.ranks[0]["weights"][name], weight, rtol=1e-4,
                                   atol=1e-6, msg=name)
