"""Benchmark: labkit's 2D step (FSDP x TP) against a plain PyTorch script, and the bytes
each mesh dimension carried against the formulas.

    python bench/composed.py          # 12 steps per run, 3 rounds
    python bench/composed.py --quick  # about a minute

Side by side in one invocation, rounds interleaved (the machine may be shared), on the same 4
CPU ranks (labkit's own, one thread each; on a 2-core machine they take turns on the cores):
1. labkit.train(layout=Layout(fsdp=2, tp=2)) on the MLP vs a plain function that builds the
   same model itself (init_device_mesh, parallelize_module with ColwiseParallel /
   RowwiseParallel on each linear pair, fully_shard on each Linear and the root, Adam, half
   of the batch per fsdp rank): ratio of median step times, target <= 1.05.
2. The bytes per step labkit counted per (dimension, collective) against what they must be:
   FSDP all-gathers this tp rank's parameters twice (forward and backward) and reduce-scatters
   its gradients once; TP all-reduces each linear pair's output in forward and the gradient of
   each pair's input in backward but the first's (Megatron's f and g); what a rank sends is
   ``labkit.runtime.costs.ring_share`` of each.
The last line printed is one JSON object of the figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import labkit
from labkit.models import MLPConfig, build_model, loss_fn, make_batch
from labkit.runtime.costs import ring_share

MODEL = MLPConfig(d_in=256, d_hidden=1024, n_layers=4, d_out=16)
BATCH = 1024
LAYOUT = labkit.Layout(fsdp=2, tp=2)
FLOAT = 4


def _plain_2d(ctx, steps: int) -> list[float]:
    """The 2D step written directly against PyTorch (no labkit): seconds per step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("fsdp", "tp"))
    model = build_model(MODEL)
    linears = [i for i, m in enumerate(model.layers) if isinstance(m, torch.nn.Linear)]
    plan = {}
    for column, row in zip(linears[0::2], linears[1::2], strict=True):
        plan[f"layers.{column}"], plan[f"layers.{row}"] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(model, mesh["tp"], plan)
    for i in linears:
        fully_shard(model.layers[i], mesh=mesh["fsdp"])
    fully_shard(model, mesh=mesh["fsdp"])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    share, slot = BATCH // 2, mesh["fsdp"].get_local_rank()
    elapsed = []
    for step in range(steps):
        inputs, targets = make_batch(MODEL, step, BATCH)
        inputs = inputs[slot * share:(slot + 1) * share].clone()
        targets = targets[slot * share:(slot + 1) * share].clone()
        start = time.perf_counter()
        loss = loss_fn(MODEL)(model(inputs), targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        elapsed.append(time.perf_counter() - start)
    dist.barrier()
    return elapsed


def plain_step_s(cluster, steps: int) -> float:
    """Median over steps (the first two left out) of the slowest rank's step time."""
    per_rank = cluster.run(_plain_2d, steps)
    return statistics.median(max(t) for t in zip(*(r[2:] for r in per_rank), strict=True))


def expected_bytes() -> dict[str, dict[str, int]]:
    """Tensor bytes per step per (dimension, collective), from the model's shapes."""
    widths = [MODEL.d_in] + [MODEL.d_hidden] * (MODEL.n_layers - 1) + [MODEL.d_out]
    pairs = list(zip(widths[0::2], widths[1::2], widths[2::2], strict=False))
    tp, rows = LAYOUT.tp, BATCH // LAYOUT.data_size
    # this tp rank's parameters: column weights and biases split by rows, row weights by
    # columns, the row bias whole
    local = sum(d_in * d_mid // tp + d_mid // tp + d_mid * d_out // tp + d_out
                for d_in, d_mid, d_out in pairs)
    forward = sum(rows * d_out for _, _, d_out in pairs)
    backward = sum(rows * d_in for d_in, _, _ in pairs[1:])
    return {"fsdp": {"all_gather": 2 * local * FLOAT, "reduce_scatter": local * FLOAT},
            "tp": {"all_reduce": (forward + backward) * FLOAT}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="about a minute")
    args = parser.parse_args()
    steps, rounds = (6, 1) if args.quick else (12, 3)
    runs: dict[str, list[float]] = {"labkit_2d": [], "plain_2d": []}
    with labkit.Cluster(LAYOUT.size, device="cpu", progress=False) as cluster:
        for round_ in range(rounds):  # who goes first alternates: load drifts on a shared box
            if round_ % 2:
                runs["plain_2d"].append(plain_step_s(cluster, steps))
            report = labkit.train(cluster, model=MODEL, layout=LAYOUT, global_batch=BATCH,
                                  steps=steps, estimate=False)
            runs["labkit_2d"].append(report.median_step_s)
            if not round_ % 2:
                runs["plain_2d"].append(plain_step_s(cluster, steps))
        oversubscribed = report.oversubscribed
    med = {k: statistics.median(v) for k, v in runs.items()}
    measured, expected = report.comm_by_dim(), expected_bytes()
    rows = []
    for dim, kinds in expected.items():
        for kind, nbytes in kinds.items():
            got = measured.get(dim, {}).get(kind, {"bytes": 0, "wire_bytes": 0})
            wire = ring_share(kind, getattr(LAYOUT, dim)) * nbytes
            rows.append({"dim": dim, "kind": kind, "bytes": got["bytes"],
                         "formula_bytes": nbytes, "wire_bytes": got["wire_bytes"],
                         "formula_wire_bytes": wire})
    figures = {
        "steps": steps, "rounds": rounds, "oversubscribed": oversubscribed,
        "step_ms": {k: round(v * 1e3, 1) for k, v in med.items()},
        "labkit_over_plain_2d": round(med["labkit_2d"] / med["plain_2d"], 3),
        "per_round": [round(a / b, 3) for a, b in zip(runs["labkit_2d"], runs["plain_2d"],
                                                      strict=True)],
        "bytes_match": all(r["bytes"] == r["formula_bytes"] for r in rows),
        "unexpected": sorted(f"{d}/{k}" for d, ks in measured.items() for k in ks
                             if k not in expected.get(d, {})),
        "comm": rows,
    }
    print(f"model: {MODEL}, batch {BATCH}, layout {LAYOUT} on 4 CPU ranks, one thread each"
          + (" (oversubscribed: ranks share cores)" if oversubscribed else ""))
    for name, value in med.items():
        print(f"  {name:10} {value * 1e3:8.1f} ms/step (median of {rounds} rounds)")
    print(f"labkit 2D / plain fully_shard + parallelize_module: "
          f"{figures['labkit_over_plain_2d']}x (target <= 1.05); per round "
          f"{figures['per_round']} (a round's two runs are close in time, rounds are not)")
    for r in rows:
        print(f"  {r['dim']:4} {r['kind']:14} measured {r['bytes']:>10,} B "
              f"(sent {r['wire_bytes']:>12,.0f}); formula {r['formula_bytes']:>10,} B "
              f"(sent {r['formula_wire_bytes']:>12,.0f})")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
