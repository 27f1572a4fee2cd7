"""Where a cluster's ranks go: which device each gets, how many share a GPU or a core."""

from __future__ import annotations

import warnings

import labkit.runtime.cluster.hardware as hardware
from labkit.runtime.cluster.errors import OversubscriptionWarning
from labkit.runtime.cluster.rank import RankSpec


def oversubscribed(device: str, world_size: int) -> bool:
    """More CPU ranks than physical cores: the ranks share cores."""
    return device == "cpu" and world_size > hardware.physical_cores()


def warn_oversubscribed(world_size: int) -> None:
    warnings.warn(
        f"{world_size} CPU ranks on {hardware.physical_cores()} physical cores: ranks share "
        "cores, so times are not those of separate devices (results say so)",
        OversubscriptionWarning, stacklevel=5)


def rank_spec(cluster, rank: int, store_port: int, generation: int, forked: bool) -> RankSpec:
    """What rank ``rank`` of ``cluster`` is started with: its device, GPU, threads, peers;
    ``store_port``: the rendezvous store's; ``generation``: the count of the ranks' starts;
    ``forked``: started by forking a zygote."""
    gpus = hardware.gpu_count() if cluster.device == "cuda" else 0
    sharing = hardware.ranks_per_gpu(cluster.world_size, gpus) if cluster.shared_gpus else 1
    threads = hardware.host_threads(cluster.device, cluster.world_size)
    return RankSpec(rank, cluster.world_size, cluster.device, cluster.backend,
                    store_port, generation, cluster.oversubscribed,
                    gpu_index=rank % gpus if gpus else None,
                    pg_timeout_s=cluster.collective_timeout, threads=threads,
                    ranks_on_gpu=sharing, forked=forked)


def job_options(cluster, capacity_bytes: int | None) -> dict:
    """What every rank needs to know for one job: its memory cap, the ranks on its GPU."""
    gpus = hardware.gpu_count() if cluster.shared_gpus else 0
    return {"capacity_bytes": capacity_bytes,
            "ranks_on_gpu": hardware.ranks_per_gpu(cluster.world_size, gpus) if gpus else 1}


def cluster_line(cluster, ranks_up: int) -> str:
    """``repr(cluster)``: its size, device, backend and state in one line."""
    state = "closed" if cluster.closed else f"{ranks_up} ranks up"
    note = ", oversubscribed" if cluster.oversubscribed else ""
    note += ", GPUs shared" if cluster.shared_gpus else ""
    return (f"Cluster(world_size={cluster.world_size}, device={cluster.device!r}, "
            f"backend={cluster.backend!r}{note}; {state})")
