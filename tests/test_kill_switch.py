"""The kill button's bookkeeping (``labkit/lessons/checkpoints/kill.py``) against a stand-in
cluster: no rank starts, no process is signalled (``os.kill`` is recorded instead). The real run,
click and recovery are ``tests/test_widgets.py``'s."""

from __future__ import annotations

import contextlib
import threading
import time

import pytest

import labkit
from labkit.lessons.checkpoints import kill as kill_module
from labkit.lessons.checkpoints.kill import KillSwitch
from labkit.models import MLPConfig
from labkit.runtime.cluster import RankError


class StandInCluster:
    """What ``KillSwitch`` uses of a cluster; ``run`` is the test's ``script(listener)``."""

    world_size, device, backend, progress, closed = 2, "cpu", "gloo", False, False

    def __init__(self, script):
        self.script, self.listener = script, None
        self.ranks = [{"rank": 0, "pid": 1000}, {"rank": 1, "pid": 1001}]

    @contextlib.contextmanager
    def listening(self, listener):
        self.listener = listener
        try:
            yield self
        finally:
            self.listener = None

    def run(self, fn, *args, **kwargs):
        return self.script(self.listener)


@pytest.fixture
def config(tmp_path):
    return labkit.TrainConfig(model=MLPConfig(d_hidden=8, n_layers=1), strategy="ddp",
                              global_batch=4, steps=6, checkpoint_dir=str(tmp_path),
                              checkpoint_every=2)


@pytest.fixture
def signals(monkeypatch):
    sent = []
    monkeypatch.setattr(kill_module.os, "kill", lambda pid, sig: sent.append((pid, sig)))
    return sent


def test_a_click_after_the_run_failed_signals_nothing(config, signals):
    """The run ended (here: an error before any kill); the button's ranks are now idle, or
    another cell's: a late click must not SIGKILL them (nor a pid reused since)."""
    def fails_after_a_step(listener):
        listener(0, 1, 6, "loss 2.0")
        listener(1, 1, 6, "")
        raise RuntimeError("the run broke by itself")

    switch = KillSwitch(StandInCluster(fails_after_a_step), config, rank=1, at_step=3)
    switch.start(background=False)
    assert isinstance(switch.error, RuntimeError)
    assert switch.kill(1) is False and switch.kill(0) is False
    assert signals == []


def test_a_click_is_recorded_before_the_run_can_see_the_rank_die(config, monkeypatch):
    """The click SIGKILLs the rank from the kernel's thread while the run's thread waits for
    it to die; however late the clicking thread gets the processor back, the run must know
    the death was the click's (else the planned recovery becomes an error)."""
    died, reported = threading.Event(), threading.Event()

    def slow_kill(pid, sig):
        died.set()
        time.sleep(0.3)  # the clicking thread is descheduled right after the signal

    def dies_when_killed(listener):
        listener(0, 1, 6, "loss 2.0")
        listener(1, 1, 6, "")
        reported.set()
        assert died.wait(10)
        raise RankError(1, "died (killed by signal SIGKILL)")

    class Report:
        ranks = [{"resumed_at": 0}]

    monkeypatch.setattr(kill_module.os, "kill", slow_kill)
    monkeypatch.setattr(labkit, "train", lambda *args, **kwargs: Report())
    monkeypatch.setattr(KillSwitch, "_finish", lambda self: None)
    switch = KillSwitch(StandInCluster(dies_when_killed), config, rank=1, at_step=3)
    switch.start(background=True)
    assert reported.wait(10)
    assert switch.kill(1) is True
    recovery = switch.result(timeout=10)
    assert (recovery.rank, recovery.failed_after, recovery.resumed_at) == (1, 1, 0)
    assert "SIGKILL" in recovery.error


def test_a_switch_runs_once(config, signals):
    def fails(listener):
        raise RuntimeError("the run broke by itself")

    switch = KillSwitch(StandInCluster(fails), config, rank=1, at_step=3)
    switch.start(background=False)
    with pytest.raises(RuntimeError, match="runs once"):
        switch.start(background=False)
