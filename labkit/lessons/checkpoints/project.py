"""The checkpoint trade-off projected to a named cluster (``labkit.plan``): never measured.

    C = checkpoint bytes per GPU / storage write bandwidth per GPU
    M = one GPU's MTBF / GPUs            (interval.cluster_mtbf)
    T = sqrt(2 C M)                       (Young/Daly, interval.young_daly)
    overhead = Daly's expected time lost per unit of work at T (interval.expected_overhead)

The checkpoint of a GPU is what it holds of the model's state: its weights and its optimizer
state, from ``labkit.plan``'s memory model of the layout (what ``get_state_dict`` hands to
DCP; every GPU writes its own shard at once, so C is one GPU's bytes over one GPU's share of
the storage). The step time is ``labkit.plan.project``'s. The two assumptions are named below.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.lessons.checkpoints import interval


@dataclass(frozen=True)
class Storage:
    """Where checkpoints go: the write bandwidth one GPU gets (all GPUs write at once)."""

    name: str
    write_bytes_per_s_per_gpu: float
    source: str


# The Llama 3 paper (arXiv:2407.21783, section 3.3.1, "Storage"): Tectonic, 240 PB on 7,500
# servers, "a sustainable throughput of 2 TB/s" for the 16,384-GPU training cluster. Spread
# evenly over those GPUs (the assumption: a file system provisioned in proportion to the
# GPUs, and every GPU writing at once): about 122 MB/s per GPU.
LLAMA3_STORAGE = Storage(
    "Llama 3's file system, 2 TB/s sustained over 16,384 GPUs", 2e12 / interval.LLAMA3["gpus"],
    "The Llama 3 Herd of Models, arXiv:2407.21783, section 3.3.1 (ASSUMED: shared evenly by "
    "all GPUs writing at once)")


@dataclass(frozen=True)
class ProjectedTradeoff:
    """One model, layout and cluster: the save cost, the failure rate, the best interval."""

    cluster: str
    layout: str
    gpus: int
    checkpoint_bytes_per_gpu: float
    save_s: float  # C
    step_s: float
    mtbf_s: float  # the job's: one GPU's over the GPU count
    interval_s: float  # Young/Daly's sqrt(2 C M), seconds of work between saves
    overhead: float  # Daly's expected time lost per unit of work at that interval
    storage: str
    # what the step is made of, from the planner (project_tradeoff; None from tradeoff alone):
    # compute_s, exposed_comm_s, bubble_s, step_s; the model FLOPs utilisation; the memory
    split: dict | None = None
    mfu: float | None = None
    peak_bytes: float | None = None  # per GPU, projected
    usable_bytes: float | None = None  # per GPU

    @property
    def fits(self) -> bool | None:
        """Whether the layout's projected peak fits a GPU (None: not known)."""
        return None if self.peak_bytes is None else self.peak_bytes <= self.usable_bytes

    @property
    def interval_steps(self) -> int:
        return max(1, round(self.interval_s / self.step_s))

    def summary(self) -> dict:
        return {**self.__dict__, "interval_steps": self.interval_steps, "fits": self.fits}


def tradeoff(projection, storage: Storage = LLAMA3_STORAGE,
             gpu_mtbf_s: float | None = None) -> ProjectedTradeoff:
    """The trade-off of a ``labkit.plan.Projection`` (one GPU's MTBF: Llama 3's by default)."""
    if gpu_mtbf_s is None:
        gpu_mtbf_s = interval.llama3_mtbf_hours()[1] * 3600
    if storage.write_bytes_per_s_per_gpu <= 0:
        raise ValueError(f"storage {storage.name!r} needs a positive write bandwidth")
    memory = projection.costs.memory
    nbytes = memory["parameters"] + memory["optimizer"]
    save_s = nbytes / storage.write_bytes_per_s_per_gpu
    gpus = projection.layout.size
    mtbf_s = interval.cluster_mtbf(gpu_mtbf_s, gpus)
    best = interval.young_daly(save_s, mtbf_s)
    return ProjectedTradeoff(str(projection.cluster), str(projection.layout), gpus, nbytes,
                             save_s, projection.step_s, mtbf_s, best,
                             interval.expected_overhead(best, save_s, mtbf_s), storage.name)


def project_tradeoff(model_config, layout, cluster, global_batch: int,
                     storage: Storage = LLAMA3_STORAGE, gpu_mtbf_s: float | None = None,
                     **levers) -> ProjectedTradeoff:
    """``labkit.plan.project`` the step, then ``tradeoff`` it (``levers``: precision,
    micro_batches, activation_checkpointing, optimizer), with the step's split, its MFU and
    whether the layout fits."""
    from labkit.plan import project

    projection = project(model_config, layout, cluster, global_batch, **levers)
    return dataclasses.replace(tradeoff(projection, storage, gpu_mtbf_s),
                               split=projection.split(), mfu=projection.mfu,
                               peak_bytes=projection.peak_bytes,
                               usable_bytes=projection.cluster.gpu.usable_memory_bytes)
