"""Per notebook: the smoke-size parameters papermill injects, and checks on what it recorded.

A notebook in notebooks/ without an entry here fails its test: every lesson must produce
values that a test reads back, so one that ran but computed nothing cannot pass.
"""

from __future__ import annotations


def check_00(results: dict) -> None:
    n = results["world_size"]
    expected = float(sum(range(n)))
    assert results["totals"] == [expected] * n
    assert results["totals_after_failure"] == [expected] * n
    assert results["failed_rank"] == 1
    rows = results["all_reduce"]
    assert [r["bytes"] for r in rows] == sorted(r["bytes"] for r in rows)
    assert all(r["seconds"] > 0 and r["busbw_GBps"] > 0 for r in rows)


NOTEBOOKS = {
    "00_your_cluster": ({"world_size": 2, "device": "cpu", "all_reduce_mib": [0.25, 1]},
                        check_00),
}
