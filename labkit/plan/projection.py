"""One projected layout (``Projection``): its step split into compute, exposed communication
and bubble, what that gives per second and per GPU, whether it fits, and the assumptions the
time model (``project.py``) makes, said beside every answer."""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

from labkit.plan.cluster import GPUCluster
from labkit.plan.levers import Lever, StepCosts
from labkit.plan.parallelism import Parallelism
from labkit.runtime.memory.units import format_bytes

ASSUMPTIONS = (
    "compute runs at the GPU's matmul rate (a microbenchmark's, hardware.py: sustained at the "
    "power limit for H100/H200/B200; the A100's burst over the H100's measured burst-to-"
    "sustained drop; MI300X's burst; measured matmul throughput on this machine), less what "
    "the run's GEMM shapes lose to tile and wave quantization on the GPU's SMs (waves.py; "
    "A100 and Hopper rows); bandwidth-bound work, exposed communication and the bubble are "
    "added on top",
    "a fused attention kernel runs at its published forward + backward rate at the run's "
    "sequence length and head dimension (FlashAttention-2: Dao 2023, Figure 7; cuDNN's, "
    "Transformer Engine's on Hopper: Shah et al. 2024, Figures 5-6; H100 rows), else at the "
    "matmul rate",
    "compute that a hidden collective overlaps runs 18.9% slower (NCCL takes SMs: the mean "
    "measured in arXiv 2507.03114 among one node's GPUs; taken as the same beside network "
    "collectives, whose NCCL kernels run on the SMs too)",
    "bandwidth-bound work (embedding lookups, the optimizer's passes over its state, counted on "
    "its ops) runs at the "
    "memory bandwidth",
    "collectives follow alpha per ring step (2(N-1) for AllReduce, N-1 for all-gather and "
    "reduce-scatter) + bytes a rank sends on a ring / link bandwidth; a group inside a node "
    "uses the GPU links at the rate NCCL was measured to reach on them (nccl-tests busbw: "
    "80-82% of NVLink 4, 78% of NVLink 3), a group across nodes the network at 95% of its "
    "NICs' rate (NCCL over 4 B200 nodes), a ring on as many NICs as the group has members in "
    "a node",
    "DDP and FSDP communication hides behind backward (and forward) as far as it fits, where "
    "the framework overlaps it: a gradient reduction done once a step under the last "
    "micro-batch's backward only, the distributed optimizer's parameter gather under the "
    "first micro-batch's forward, FSDP's gathers under every micro-batch (under its forwards "
    "where the framework keeps them to backward; in a pipeline, whose stages stay gathered "
    "to the step's end, then under the first forward, and the reduce-scatter after the last "
    "backward, exposed); tp hides only under Megatron-Core's overlap; pipeline sends are "
    "exposed; on this machine nothing hides (a CPU rank's collectives share its one core)",
    "a pipeline idles (p-1)/v micro-batch times per step",
    "on this machine only: tp's DTensor dispatch and FSDP2's hooks add a measured cost per "
    "parameter tensor (labkit.plan.engines); on GPUs taken as hidden (0)",
    "on this machine only: ranks that meet in collectives wait for the slowest one, a "
    "measured fraction of compute (labkit.plan.jitter; 0 on GPUs and on ranks over cores)",
    "cp's ring sends and ep's all-to-alls are exposed whole (no overlap credited: an upper "
    "bound; ring attention sends the next block while it computes the current one); beside "
    "tp, each tp rank rings its own heads' keys and values (Megatron-Core's cp x tp; labkit's "
    "engines train cp beside dp and fsdp only)",
    "a GPU's memory is its driver-reported total (vendors' 'GB' are GiB); a layout fits when "
    "its peak stays under that less 2 GiB (CUDA context, NCCL buffers) and 5% "
    "(fragmentation): hardware.MEMORY_RESERVED_BYTES, MEMORY_FRAGMENTATION",
    "'mixed' is the framework's recipe (labkit, torchtitan: fp32 weights, gradients reduced in "
    "fp32 and Adam moments, bf16 compute; Megatron: bf16 weights, fp32 main gradients, fp32 "
    "master and moments); 'bf16' keeps weights and optimizer state in bf16 too (a "
    "convergence risk)",
    "'fp16' is 'mixed' with fp16 compute (the same peak as bf16 on every GPU of the table) and "
    "dynamic loss scaling: the same model state, one pass over the gradients a step to "
    "unscale and check them; steps skipped on overflow are not charged",
    "attention: a fused causal kernel on GPUs (FlashAttention: no seq x seq scores kept or "
    "written, half of them computed); the math path on this machine",
)

BF16_CAVEAT = ("pure bf16: weights and optimizer state in bf16 lose updates smaller than "
               "bf16's resolution (8 bits of mantissa), a convergence risk; mixed precision is "
               "the training default (fp32 master state)")


FP16_CAVEAT = ("fp16: values beyond 65504 overflow and below 6e-8 vanish; dynamic loss scaling "
               "skips the steps whose scaled gradients overflow (a few while the scale "
               "settles, then rare): not charged here")


@dataclass
class Projection:
    """One layout on one cluster, projected (never measured).

    Times are seconds per step; ``comm_s`` is each dimension's busy time, ``exposed_s`` what
    of it the step waits for."""

    model: object
    layout: Parallelism
    cluster: GPUCluster
    lever: Lever
    costs: StepCosts
    compute_s: float
    comm_s: dict[str, float]
    exposed_s: dict[str, float]
    bubble_s: float
    links: dict[str, str] = field(default_factory=dict)
    assumptions: tuple[str, ...] = ASSUMPTIONS

    @property
    def step_s(self) -> float:
        return self.compute_s + sum(self.exposed_s.values()) + self.bubble_s

    @property
    def samples_per_s(self) -> float:
        return self.lever.global_batch / self.step_s

    @property
    def tokens_per_s(self) -> float:
        return self.costs.tokens / self.step_s

    @property
    def mfu(self) -> float:
        """Model FLOPs per second over the cluster's peak (no recomputation counted)."""
        peak = self.cluster.gpu.peak_flops(self.lever.precision) * self.layout.size
        return self.costs.model_flops / self.step_s / peak

    @property
    def hardware_flops_per_gpu(self) -> float:
        """FLOP/s each GPU computes (recomputation counted, the busiest rank's): the
        hardware's rate, beside ``mfu``'s model FLOPs over peak."""
        return self.costs.flops / self.step_s

    @property
    def peak_bytes(self) -> float:
        return self.costs.peak_bytes

    @property
    def fits(self) -> bool:
        """Peak under the GPU's usable memory (capacity less the reserve and fragmentation)."""
        return self.peak_bytes <= self.cluster.gpu.usable_memory_bytes

    @property
    def caveats(self) -> tuple[str, ...]:
        """What a reader must know before trusting this layout to train (not only to run)."""
        return {"bf16": (BF16_CAVEAT,), "fp16": (FP16_CAVEAT,)}.get(self.lever.precision, ())

    def time_to_train(self, tokens: float | None = None, samples: float | None = None) -> dict:
        """Wall-clock seconds, days and GPU-hours to train ``tokens`` (or ``samples``)."""
        if (tokens is None) == (samples is None):
            raise ValueError("give tokens= (decoders) or samples= (any model), one of them")
        amount = samples if samples is not None else tokens
        if not (isinstance(amount, numbers.Real) and 0 <= amount < math.inf):
            raise ValueError(f"time_to_train: tokens= or samples= is a number of them, 0 or "
                             f"more and finite, not {amount!r}")
        steps = (samples / self.lever.global_batch if samples is not None
                 else tokens / self.costs.tokens)
        seconds = steps * self.step_s
        return {"seconds": seconds, "days": seconds / 86400,
                "gpu_hours": seconds * self.layout.size / 3600}

    def split(self) -> dict[str, float]:
        return {"compute_s": self.compute_s, "exposed_comm_s": sum(self.exposed_s.values()),
                "bubble_s": self.bubble_s, "step_s": self.step_s}

    def summary(self) -> dict:
        return {"layout": str(self.layout), "cluster": str(self.cluster),
                "precision": self.lever.precision, "micro_batches": self.lever.micro_batches,
                "activation_checkpointing": self.lever.activation_checkpointing,
                **self.split(), "samples_per_s": self.samples_per_s,
                "tokens_per_s": self.tokens_per_s, "mfu": self.mfu,
                "hardware_tflops_per_gpu": self.hardware_flops_per_gpu / 1e12,
                "peak_bytes": self.peak_bytes, "fits": self.fits, "links": self.links,
                "caveats": list(self.caveats)}

    def _repr_html_(self) -> str:
        s = self.split()
        return (f"<b>projected</b> {self.layout} on {self.cluster}: step "
                f"{s['step_s'] * 1e3:.1f} ms (compute {s['compute_s'] * 1e3:.1f}, exposed "
                f"comm {s['exposed_comm_s'] * 1e3:.1f}, bubble {s['bubble_s'] * 1e3:.1f}); "
                f"MFU {self.mfu:.0%}, {self.hardware_flops_per_gpu / 1e12:.0f} hardware "
                f"TFLOP/s per GPU; peak {format_bytes(self.peak_bytes)} per GPU of "
                f"{format_bytes(self.cluster.gpu.usable_memory_bytes)} usable"
                + "".join(f"<br><b>caveat</b>: {c}" for c in self.caveats) +
                f"<br><small>assumptions: {'; '.join(self.assumptions)}</small>")
