"""``python -m labkit doctor``: is this machine ready for the suite?

Prints torch's version, devices, cores and backends, then runs a 2-rank all_reduce on CPU
and, where there is a GPU, on GPUs (one GPU: 1 NCCL rank, and 2 ranks sharing it). Exits
non-zero when something is broken.
"""

from __future__ import annotations

import platform
import time

import psutil
import torch
import torch.distributed as dist

from labkit.runtime.cluster.cluster import Cluster
from labkit.runtime.cluster.hardware import gpu_count, physical_cores


def _sum_of_ranks(ctx) -> float:
    tensor = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(tensor, group=ctx.group)
    return tensor.item()


def _smoke(device: str, ranks: int = 2) -> bool:
    start = time.monotonic()
    expected = [float(sum(range(1, ranks + 1)))] * ranks
    try:
        with Cluster(ranks, device=device, progress=False) as cluster:
            started = time.monotonic() - start
            totals = cluster.run(_sum_of_ranks, timeout=60)
    except Exception as exc:  # noqa: BLE001 - the doctor reports every failure
        print(f"  FAIL {ranks}-rank all_reduce on {device}: {exc}")
        return False
    ok = totals == expected
    print(f"  {'ok  ' if ok else 'FAIL'} {ranks}-rank all_reduce on {device} ({cluster.backend}"
          f"{', GPU shared' if cluster.shared_gpus else ''}): {totals} (expected {expected}), "
          f"cluster started in {started:.1f} s")
    return ok


def main() -> int:
    gpus = gpu_count()
    print(f"python {platform.python_version()}, torch {torch.__version__}")
    print(f"cores: {physical_cores()} physical, {psutil.cpu_count()} logical; "
          f"memory {psutil.virtual_memory().total / 2**30:.1f} GiB")
    names = [torch.cuda.get_device_name(i) for i in range(gpus)]
    print(f"GPUs: {gpus}" + (f" ({', '.join(names)})" if names else " (CPU ranks act as "
                                                                      "virtual GPUs)"))
    backends = {name: getattr(dist, f"is_{name}_available")() for name in ("gloo", "nccl", "mpi")}
    print("backends: " + ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in backends.items()))
    checks = [backends["gloo"] and _smoke("cpu")]
    if gpus and backends["nccl"]:  # one GPU: NCCL on 1 rank, then 2 ranks sharing it (gloo)
        checks.append(_smoke("cuda", min(2, gpus)))
        if gpus == 1:
            checks.append(_smoke("cuda", 1))
    healthy = all(checks)
    print("verdict: ready" if healthy else "verdict: BROKEN (see FAIL lines above)")
    return 0 if healthy else 1
