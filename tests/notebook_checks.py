"""Per notebook: the smoke-size parameters papermill injects, and checks on what it recorded.

A notebook in notebooks/ without an entry here fails its test: every lesson must produce
values that a test reads back, so one that ran but computed nothing cannot pass.
"""

from __future__ import annotations

import pytest

from labkit.plan.hardware import GPUS


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
    assert results["big_params"]["7B"] > 6e9  # a big, deep model (quiz 00's evidence)
    assert 15.5 < results["state_per_param"]["7B"] < 16.5  # "about 16 bytes per parameter"
    levers = {run["name"]: run for run in results["levers"]}
    assert all(run["oom"] is None and run["step_s"] > 0 for run in levers.values())
    assert all(abs(run["estimated_bytes"] - run["peak_bytes"]) < 0.1 * run["peak_bytes"]
               for run in levers.values())  # the estimator traces every lever
    plain = levers["plain"]["category_peaks"]["activations"]
    for name in ("checkpointing", "accumulation x4", "bf16"):  # each saves activation memory
        assert levers[name]["category_peaks"]["activations"] < plain, name
    assert results["boundary_agreement"] >= 0.8
    fits = [c["fits"] for c in results["boundary"]["cells"]]
    assert any(fits) and not all(fits)
    assert results["losses"][-1] < results["losses"][0]
    maps = {m["lever"]: m["cells"] for m in results["lever_boundaries"]}  # plain first
    assert list(maps)[0] == "plain" and len(maps) >= 2
    for lever, cells in list(maps.items())[1:]:  # plain's cells are the boundary's above
        trained = [c for c in cells if c["measured_fits"] is not None]
        assert trained, lever  # each lever's boundary is confirmed by real runs
        assert all(c["measured_fits"] == c["predicted_fits"] for c in trained), lever
        assert sum(c["predicted_fits"] for c in cells) >= sum(fits), lever  # never fewer


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
    # the runs the quizzes point to (evidence:... cells)
    assert results["held_out"]["gap"] < 1e-5  # N devices generalise exactly as one
    ends = results["endpoints"]["held_out_losses"]
    assert len(set(ends)) == len(ends) == n  # different starts, different ends
    turns = results["turns"]
    assert turns["utilisation"]["turns"] <= 1 / n + 0.05  # each device busy ~1/N of a step
    work = results["work"]
    assert sum(work["flops"]) == work["whole_flops"] and work["flops_per_s"] > 0
    whole, accumulated = results["accumulation_activations"].values()
    assert accumulated < whole  # accumulation saves activation memory, not time
    timeline = results["bucket_timeline"]  # the overlap plot's buckets are DDP's
    assert len(timeline["buckets"]) == timeline["ddp_buckets"] > 1
    assert all(0 <= b["issued"] <= b["done"] for b in timeline["buckets"])
    fit = results["ring_fit"]  # the ring formula's terms come from other sizes than it predicts
    assert fit["held_out_bytes"] not in fit["sizes_bytes"] and len(fit["sizes_bytes"]) >= 2
    assert fit["bandwidth"] > 0 and fit["predicted_s"] > 0 and fit["held_out_s"] > 0
    assert results["bus_bandwidth"] == fit["bandwidth"]


def check_03(results: dict) -> None:
    assert results["single_oom"], "the model was meant not to fit one device"
    for peaks in results["peaks"].values():
        assert max(peaks) <= results["capacity"]  # but it fits as stages
    losses = results["losses"]
    for name in ("gpipe", "1f1b"):  # micro-batching does not change the training
        assert all(abs(a - b) < 1e-5 for a, b in zip(losses[name], losses["naive"], strict=True))
    assert all(abs(a - b) < 1e-5 for a, b in zip(losses["gpipe"], losses["one_device"],
                                                  strict=True))  # the pipeline trains as one
    assert abs(results["bubble"]["naive"] - results["theory"]["naive"]) < 0.15
    assert results["activations"]["1f1b"] < results["activations"]["gpipe"]


def check_04(results: dict) -> None:
    assert results["split_errors"] == {"column": 0.0, "row": 0.0}
    assert results["single_oom"], "the model was meant not to fit one device"
    assert max(results["tp_peaks"]) <= results["capacity"]  # but it fits split
    losses = results["losses"]
    assert all(abs(a - b) < 1e-4 * abs(b) for a, b in zip(losses["tp"], losses["reference"],
                                                           strict=True))
    n, params = results["world_size"], results["parameters"]
    assert all(p < 1.1 * params["reference"] / n for p in params["tp"])  # about 1/N each
    pairs = results["n_layers"] // 2  # forward: one AllReduce per pair; backward: all but 1st
    rows = results["per_layer"]
    assert sum(r["calls"] for r in rows if r["phase"] == "forward") == pairs
    assert sum(r["calls"] for r in rows if r["phase"] == "backward") == pairs - 1
    assert all(r["bytes"] == 4 * r["shape"][0] * r["shape"][1] for r in rows)
    total, n = sum(r["bytes"] for r in rows), results["world_size"]
    assert results["step_comm"] == {"all_reduce": [2 * pairs - 1, total,
                                                   pytest.approx(2 * (n - 1) / n * total)]}
    tp = [r for r in results["versus"] if r["strategy"] == "tp"]
    ddp = [r for r in results["versus"] if r["strategy"] == "ddp"]
    assert all(r["bytes"] * tp[0]["batch"] == tp[0]["bytes"] * r["batch"] for r in tp)
    assert len({r["bytes"] for r in ddp}) == 1
    assert tp[0]["bytes"] < ddp[0]["bytes"] and tp[-1]["bytes"] > ddp[-1]["bytes"]
    assert tp[0]["batch"] < results["crossover"] < tp[-1]["batch"]


def check_05(results: dict) -> None:
    rows = {(r["strategy"], r["world_size"]): r for r in results["rows"]}
    assert all(r["estimate_error"] < 0.10 for r in rows.values())  # estimator within 10%
    n = max(results["world_sizes"])
    peak = {s: rows[s, n]["peak_bytes"] for s in ("ddp", "zero1", "fsdp")}
    assert peak["fsdp"] < peak["zero1"] < peak["ddp"]
    assert peak["ddp"] > 0.95 * rows["ddp", 1]["peak_bytes"]  # DDP: a full copy per rank
    assert all(gap < 1e-4 for gap in results["loss_gaps"].values())
    kinds = {s: rows[s, n]["comm_kinds"] for s in ("ddp", "zero1", "fsdp")}
    gradients = kinds["ddp"]["all_reduce"][1]
    assert kinds["fsdp"]["reduce_scatter"][1] == gradients
    assert kinds["zero1"]["broadcast"][1] >= gradients
    wire = {s: rows[s, n]["comm_wire_bytes"] for s in ("ddp", "zero1", "fsdp")}
    assert wire["fsdp"] == pytest.approx(1.5 * wire["ddp"], rel=0.02)  # three passes vs two
    assert wire["zero1"] == pytest.approx(1.5 * wire["ddp"], rel=0.02)
    fit = results["largest_fitting"]
    assert (fit["fsdp"] or 0) >= (fit["zero1"] or 0) >= (fit["ddp"] or 0)
    assert (fit["fsdp"] or 0) > (fit["ddp"] or 0), "the boundary was meant to move"
    assert all(a >= 0.8 for a in results["agreement"].values())
    per_param = results["bytes_per_param"]  # the runs are fp32 Adam: 4 + 4 + 8 (+ temporaries)
    assert per_param["parameters"] == per_param["gradients"] == 4.0
    assert 8.0 <= per_param["optimizer"] < 12.0  # Adam's two moments, and its step's temporaries


def check_06(results: dict) -> None:
    n, capacity, parts = results["world_size"], results["capacity"], results["parts"]
    assert parts["table_weights"] > 10 * parts["dense_weights"]  # tables are the model
    for name in ("single_oom", "ddp_oom"):  # one device, and DDP's full copies, do not fit
        oom = results[name]
        assert oom is not None, f"{name}: the tables were meant not to fit one device"
        state = sum(oom["breakdown"][c] for c in ("parameters", "gradients", "optimizer"))
        assert state > oom["breakdown"]["activations"]
    plan = results["plan"]
    assert sorted(t for ts in plan["tables_per_rank"] for t in ts) + plan["row_wise"] == sorted(
        range(len(plan["table_bytes"])))
    assert plan["fits"] and max(plan["total_bytes"]) <= capacity
    for name in ("table_wise", "row_wise"):
        assert max(results["peaks"][name]) <= capacity  # sharded, the same tables fit
        tables = [rank["tables"] for rank in results["memory"][name]]
        assert abs(sum(tables) - parts["table_training"]) < 0.01 * parts["table_training"]
        assert max(tables) < 1.3 * parts["table_training"] / n  # about 1/N per rank
        before, after = results["auc"][name]
        assert after[-1] > before + 0.05  # it learns, on samples it never saw
        losses = results["losses"][name]
        assert losses[-1] < losses[0]
    assert all(abs(a - b) < 1e-5 for a, b in zip(results["losses"]["table_wise"],
                                                  results["losses"]["row_wise"], strict=True))
    assert all(abs(a - b) < 1e-5 for a, b in zip(results["losses"]["table_wise"],
                                                  results["losses"]["one_device"], strict=True))
    assert "all_to_all" in results["comm"]["table_wise"]
    assert "reduce_scatter" in results["comm"]["row_wise"]
    for name, run in results["speed"].items():
        assert run["samples_per_s"] > 0, name
        if run["split"] is not None:
            split = run["split"]
            assert min(split["lookup_s"], split["comm_s"], split["dense_s"]) >= 0
            assert abs(split["lookup_s"] + split["comm_s"] + split["dense_s"]
                       - split["step_s"]) < 1e-9


def check_07(results: dict) -> None:
    runs, capacity = results["runs"], results["capacity"]
    assert "oom" in runs["one device"], "the model was meant not to fit one device"
    assert "oom" in runs["data parallel alone"], "DDP's full copies were meant not to fit"
    for name in ("model parallel alone", "both"):  # splitting the layers makes it fit
        run = runs[name]
        assert "oom" not in run, name
        assert max(run["peaks"]) <= capacity and run["samples_per_s"] > 0
        assert run["estimate_error"] < 0.10  # the estimator traces composed layouts too
    both = runs["both"]
    assert set(both["comm_by_dim"]) == {"dp", "tp"}  # each collective filed under its group
    assert results["loss_gap"] < 1e-4  # the composed run trains as one device
    assert results["dim_bytes"]["dp"] > 0 and results["dim_bytes"]["tp"] > 0
    n = results["world_size"]
    assert results["groups"] == [[r, r + 1] for r in range(0, n, 2)]  # tp: neighbours
    assert results["check"]["status"] == "passed"


def check_08(results: dict) -> None:
    peaks, capacity = results["peaks"], results["capacity"]
    longest = results["seq_options"][-1]
    assert peaks[str(longest)]["one device"] is None, "the longest sequence must OOM one device"
    cp = f"cp={results['cp']}"
    assert peaks[str(longest)][cp] is not None, f"... and train with {cp} under the same cap"
    assert all(p <= capacity for row in peaks.values() for p in row.values() if p is not None)
    assert 0.3 < results["peak_ratio"] < 1.0
    assert results["loss_gap"] < 1e-4  # ring attention is exact
    blocks = [sum(len(step["pairs"]) for step in rank) for rank in results["schedule"]]
    assert len(set(blocks)) == 1, blocks  # balanced: the same work on every rank
    assert results["check"]["status"] == "passed"
    slots = results["moe_capacity"] * results["global_batch"]
    assert all(0 < max(layer) <= slots for step in results["expert_load"] for layer in step)
    dense, moe = results["comparison"]["dense"], results["comparison"]["moe"]
    assert moe["params"] > dense["params"]
    assert results["all_to_all"]["calls"] > 0 and results["all_to_all"]["bytes"] > 0
    dropped = list(results["dropped"].values())
    assert dropped == sorted(dropped, reverse=True) and dropped[0] > 0
    by_expert = [sum(map(sum, layers)) for layers in results["dropped_by_expert"].values()]
    assert by_expert == sorted(by_expert, reverse=True) and by_expert[0] > 0  # the slider's


def check_10(results: dict) -> None:
    steps, every, at = results["steps"], results["checkpoint_every"], results["kill_at_step"]
    assert "RankError" in results["error"] and f"rank {results['kill_rank']}" in results["error"]
    resumed = (at - 1) // every * every  # the save due at the failure's step never happened
    assert results["resumed_at"] == resumed and results["lost_steps"] == at - resumed > 0
    assert results["from_checkpoint"] == [True] * resumed + [False] * (steps - resumed)
    assert results["recovered_losses"] == results["reference_losses"][:steps]  # bit for bit
    assert results["continued_resumed_at"] == steps
    assert results["fewer"] < results["world_size"]
    assert results["continued_losses"][:steps] == results["recovered_losses"]
    assert results["fewer_gap"] < 1e-4  # resharded onto fewer ranks: float rounding only
    assert results["save_s"] > 0 and results["step_s"] > 0 and results["young_daly_steps"] >= 1
    assert results["check"]["status"] == "passed"
    assert results["failed_after"] == at  # killed by the widget's kill() at the planned step
    projected = results["projected"]  # labkit.checkpoint.project: never measured
    assert all(0 < row["overhead"] < 0.5 and row["interval_s"] > row["save_s"] > 0
               for row in projected.values()), projected


def check_09(results: dict) -> None:
    comparisons = results["comparisons"]
    assert {c["ranks"] for c in comparisons} == {1, results["world_size"]}
    assert all(c["projected_s"] > 0 and c["measured_s"] > 0 for c in comparisons)
    assert results["error"]["runs"] == len(comparisons)  # the error stats cover every run
    for n, calibration in results["calibration"].items():  # measured, never assumed
        assert calibration["matmul_flops"] > 0 and calibration["op_overhead_s"] > 0
        assert bool(calibration["links"]) == (int(n) > 1)
    days = results["recommender_days"]  # more GPUs, placed by the planner: fewer days
    assert days["8 x A100 (1 node)"] < days["1 x RTX 4090"]
    sustained = GPUS["H100"].matmul_efficiency  # what the H100's matmuls sustain
    for name, row in results["decoders"].items():
        # compute starts at the sustained matmul rate and every other cost comes on top
        # (FlashAttention-2 at 35% of peak, under it): MFU stays below that rate, and above
        # 0.3, under the least of the published runs in labkit.plan.published (torchtitan's)
        assert row["fits"] and 0.3 < row["mfu"] < sustained, name
        assert row["links"].get("tp", "in-node") == "in-node", name  # tp never crosses nodes
    assert results["check"]["status"] == "passed"
    published = results["published"]  # "projected beside published": each within 25%
    assert len(published) == 3 and all(r["fits"] and abs(r["error"]) < 0.25 for r in published)


NOTEBOOKS = {
    "00_your_cluster": ({"world_size": 2, "device": "cpu", "all_reduce_mib": [0.25, 1]},
                        check_00),
    "01_the_memory_wall": ({"sizes": [2e5, 5e5, 2e6], "size": 2e5, "big_models": ["7B"],
                            "boundary_world_sizes": [1, 2], "boundary_levers": ["bf16"],
                            "interactive": False}, check_01),
    "02_data_parallel": ({"world_size": 2, "params": 5e5, "global_batch": 64, "steps": 3,
                          "sizes": [5e5], "world_sizes": [1, 2], "bucket_caps": [0.25, 25],
                          "comm_sizes_kib": [16, 256, 4096],
                          "interactive": False},
                         check_02),
    "03_pipeline_parallel": ({"d_hidden": 512, "n_layers": 4, "global_batch": 256,
                              "memory_per_device": "8MiB", "micro_batches": 4,
                              "stage_options": [2], "micro_options": [1, 4], "steps": 2,
                              "interactive": False}, check_03),
    "04_tensor_parallel": ({"d_hidden": 512, "n_layers": 4, "global_batch": 64,
                            "memory_per_device": "8MiB", "world_size": 2, "steps": 3,
                            "degree_options": [1, 2], "batches": [32, 256, 1024],
                            "interactive": False}, check_04),
    "05_sharded_data_parallel": ({"d_hidden": 512, "n_layers": 6, "global_batch": 32,
                                  "steps": 3, "world_sizes": [1, 2],
                                  "boundary_sizes": [2e5, 6e5, 1.5e6], "interactive": False},
                                 check_05),
    "06_recommender_at_scale": ({"world_size": 2, "rows_per_table": 4000,
                                 "memory_per_device": "6MiB", "global_batch": 256, "steps": 20,
                                 "epoch_samples": 100_000, "rows_options": [2000, 4000],
                                 "gpu_options": [1, 2], "interactive": False}, check_06),
    "07_putting_it_together": ({"world_size": 4, "d_hidden": 512, "n_layers": 4,
                                "global_batch": 64, "memory_per_device": "8MiB", "steps": 3,
                                "interactive": False}, check_07),
    "08_long_sequences_and_experts": ({"seq_options": [256, 512], "memory_per_device": "4MiB",
                                       "capacity_factors": [0.5, 2.0], "moe_steps": 3,
                                       "interactive": False}, check_08),
    "09_plan_a_real_run": ({"world_size": 2, "steps": 3, "calibration_runs": 3,
                            "decoders": ["7B"], "interactive": False}, check_09),
    "10_when_a_gpu_dies": ({"world_size": 2, "d_hidden": 64, "n_layers": 3, "global_batch": 16,
                            "steps": 8, "checkpoint_every": 3, "kill_at_step": 5,
                            "interactive": False}, check_10),
}
