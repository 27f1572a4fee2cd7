"""The claims of notebook 00_your_cluster, asserted at its classroom defaults.

Each test is named after the sentence of the lesson it protects; the notebook is executed
once (tests/lessons.py) and every test here reads what it recorded.
"""

from __future__ import annotations

import pytest

from tests.lessons import lesson_fixture

MIB = 2**20


nb = lesson_fixture("00_your_cluster")


@pytest.fixture(scope="module")
def busbw(nb):
    return {row["bytes"] / MIB: row["busbw_GBps"] for row in nb.results["all_reduce"]}


def test_recorded_values(nb):
    results = nb.results
    rows = results["all_reduce"]
    assert [r["bytes"] for r in rows] == sorted(r["bytes"] for r in rows)
    assert all(r["seconds"] > 0 and r["busbw_GBps"] > 0 for r in rows)


def test_the_notebooks_start_at_most_one_rank_per_core_or_gpu_by_default(nb):
    results = nb.results
    assert 2 <= results["world_size"] <= max(results["cores"], results["gpus"], 2)


def test_every_rank_holds_the_same_total(nb):
    n = nb.results["world_size"]
    assert nb.results["totals"] == [float(sum(range(n)))] * n


def test_ranks_cells_show_what_each_rank_prints_under_its_rank(nb):
    """The first AllReduce, a %%ranks cell: each rank's print under its rank, and the value
    of its last line on each rank, in rank order, kept in ``totals`` by --out."""
    [index] = nb.cells_with("%%ranks cluster --out totals\n")
    cell = nb.cell(index)
    printed = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    n = nb.results["world_size"]
    assert all(f"[rank {r}] putting in {float(r)}" in printed for r in range(n)), printed
    [shown] = [o.data["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]
    assert shown == repr(nb.results["totals"])


def test_small_messages_move_far_fewer_bytes_per_second_than_large_ones(busbw):
    smallest = min(busbw)
    assert busbw[smallest] < 0.2 * max(busbw.values()), busbw


def test_at_the_largest_sizes_the_rate_stops_growing(busbw):
    """The largest message (4x the bytes of the one before it) moves hardly more bytes per
    second than the best smaller size: less than a fifth more, where the small sizes gain
    several times per step. Where past a few MiB the peak falls (4 or 16 MiB), and whether the
    size after it dips, varies from run to run on CPU ranks (one run: 4 MiB 1.53 GB/s, 16 MiB
    1.11, 64 MiB 1.41)."""
    sizes = sorted(busbw)
    assert len(sizes) >= 3 and sizes[-1] >= 4 * sizes[-2], busbw
    assert busbw[sizes[-1]] < 1.2 * max(busbw[s] for s in sizes[:-1]), busbw


def test_labkit_raises_rank_error_with_the_failing_ranks_own_traceback(nb):
    results = nb.results
    assert results["failed_rank"] == 1
    assert "Remote traceback (rank 1)" in results["failure"]
    assert "this rank ran into a bad batch" in results["failure"]


def test_the_cluster_restarts_its_ranks_on_the_next_run(nb):
    assert nb.results["totals_after_failure"] == nb.results["totals"]
