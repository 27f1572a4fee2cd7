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


def check_01(results: dict) -> None:
    measured = results["measured_peak"]
    assert abs(results["estimated_peak"] - measured) < 0.1 * measured
    assert measured <= results["capacity"]
    assert sum(v for k, v in results["at_peak"].items() if k != "total") == measured
    oom = results["oom"]
    assert oom is not None, "the largest size was meant to run out of memory"
    assert oom["in_use"] + oom["requested"] > oom["capacity"] >= oom["in_use"]
    assert results["big_models"]["7B"] > 80e9  # does not fit one 80 GB GPU
    assert results["boundary_agreement"] >= 0.8
    fits = [c["fits"] for c in results["boundary"]["cells"]]
    assert any(fits) and not all(fits)
    assert results["losses"][-1] < results["losses"][0]


def check_02(results: dict) -> None:
    gaps = results["parity_gap"]
    assert len(gaps) == 4 and all(gap < 1e-4 for gap in gaps.values())  # same training
    for name, split in results["split"].items():
        assert abs(split["compute_s"] + split["comm_s"] - split["step_s"]) < 1e-9, name
    n = results["world_size"]
    assert results["strong"]["1"] == 1.0 and results["weak"]["1"] == 1.0
    assert results["strong"][str(n)] > 0 and results["bus_bandwidth"] > 0
    comm = results["comm"][str(n)]
    assert comm["bytes"] > 0 and comm["predicted_s"] > 0 and comm["measured_busy_s"] > 0


def check_03(results: dict) -> None:
    assert results["single_oom"], "the model was meant not to fit one device"
    for peaks in results["peaks"].values():
        assert max(peaks) <= results["capacity"]  # but it fits as stages
    losses = results["losses"]
    for name in ("gpipe", "1f1b"):  # micro-batching does not change the training
        assert all(abs(a - b) < 1e-5 for a, b in zip(losses[name], losses["naive"], strict=True))
    assert abs(results["bubble"]["naive"] - results["theory"]["naive"]) < 0.15
    assert results["activations"]["1f1b"] < results["activations"]["gpipe"]


NOTEBOOKS = {
    "00_your_cluster": ({"world_size": 2, "device": "cpu", "all_reduce_mib": [0.25, 1]},
                        check_00),
    "01_the_memory_wall": ({"sizes": [2e5, 5e5, 2e6], "size": 2e5, "big_models": ["7B"],
                            "boundary_world_sizes": [1, 2], "interactive": False}, check_01),
    "02_data_parallel": ({"world_size": 2, "params": 5e5, "global_batch": 64, "steps": 3,
                          "sizes": [5e5], "world_sizes": [1, 2], "interactive": False},
                         check_02),
    "03_pipeline_parallel": ({"d_hidden": 512, "n_layers": 4, "global_batch": 256,
                              "memory_per_device": "8MiB", "micro_batches": 4,
                              "stage_options": [2], "micro_options": [1, 4], "steps": 2,
                              "interactive": False}, check_03),
}
