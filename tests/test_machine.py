"""Rank counts fitted to the machine: one per core or GPU by default, the rest on offer."""

from __future__ import annotations

import pytest

from labkit.runtime.cluster import machine


@pytest.fixture
def two_cores(monkeypatch):
    monkeypatch.setattr(machine, "physical_cores", lambda: 2)
    monkeypatch.setattr(machine, "gpu_count", lambda: 0)


def test_a_laptop_gets_one_rank_per_core_and_is_told_why(two_cores):
    fit = machine.fit_to_machine(4, offered=[1, 2, 4])
    assert fit.world_size == 2 and fit.oversubscribed == (4,)
    assert "2 physical cores" in fit.why and "oversubscribe = True" in fit.why
    assert fit.fitting([1, 2, 4]) == [1, 2]
    assert "4 (oversubscribed)" in fit._repr_html_()


def test_oversubscribing_on_purpose(two_cores):
    fit = machine.fit_to_machine(4, offered=[1, 2, 4], oversubscribe=True)
    assert fit.world_size == 4 and "share cores" in fit.why
    assert fit.fitting([1, 2, 4]) == [1, 2, 4]


def test_gpus_and_small_machines(monkeypatch):
    monkeypatch.setattr(machine, "physical_cores", lambda: 1)
    monkeypatch.setattr(machine, "gpu_count", lambda: 8)
    assert machine.fit_to_machine(4).world_size == 4  # one GPU each
    monkeypatch.setattr(machine, "gpu_count", lambda: 0)
    assert machine.fit_to_machine(4).world_size == 2  # lessons compare 1 device with 2
    with pytest.raises(ValueError, match="whole number"):
        machine.fit_to_machine(2.5)


def test_the_count_that_starts_is_the_one_marked_started(two_cores):
    """A lesson that asks for 4 on 2 cores starts 2: the line says which count starts, and
    says nothing more when the only count on offer is the one asked for."""
    fit = machine.fit_to_machine(4, offered=[1, 2, 4, 8])
    assert "2 (started here)" in fit._repr_html_() and "8 (oversubscribed)" in fit._repr_html_()
    alone = machine.fit_to_machine(4, offered=[4])._repr_html_()
    assert "offers" not in alone and "2 ranks instead of 4" in alone
