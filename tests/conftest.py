"""Shared fixtures: warm clusters, and checks that no rank outlives its test."""

from __future__ import annotations

import time

import psutil
import pytest

import labkit


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


@pytest.fixture(scope="module")
def four():
    """A warm 4-rank CPU cluster, shared by a test module (oversubscribed on a 2-core
    machine: slower, still right)."""
    with labkit.Cluster(4, device="cpu", progress=False) as cluster:
        yield cluster
