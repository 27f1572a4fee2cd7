"""Accelerators and clusters the planner projects onto: one sourced table.

Every figure is the vendor's *peak* for one device (dense: no 2:4 sparsity), as printed in
the datasheet named in its row, read on the date given there. Bandwidths are bytes per second
*per GPU in one direction*: NVIDIA quotes NVLink as the sum of both directions (H100 SXM
"900 GB/s" is 450 GB/s each way), so the table halves it; an InfiniBand/RoCE NIC of 400 Gb/s
is 50 GB/s each way. Where a datasheet gives a figure only "with sparsity", the dense figure
is half of it (the datasheets' own footnote). Where a figure is not in a vendor datasheet
(GPUs per node of a workstation, the network of a node built from PCIe cards), the row says
so in ``note``: it is a typical build, not a fact about the chip.

``labkit.plan.Cluster("H100", gpus_per_node=8, nodes=4)`` names a cluster of them; this
machine's own figures are measured (``labkit.plan.calibrate``) and form a ``Cluster`` of their
own (``Calibration.cluster()``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

GB = 1e9
TFLOPS = 1e12
ACCESSED = "2026-12-01"  # the date the datasheets below were read for this table


@dataclass(frozen=True)
class GPU:
    """One accelerator's peak figures (dense), per device.

    Attributes:
        name: the key of the table ("H100").
        memory_bytes: device memory.
        bf16_flops, fp32_flops: dense peak FLOP/s: bf16 on the matrix units (tensor cores)
            with fp32 accumulation; fp32 without them (no TF32).
        memory_bandwidth: device-memory bytes/s.
        gpus_per_node: GPUs in the vendor's reference node (DGX/HGX, the MI300X platform).
        intra_node_bandwidth: bytes/s each GPU sends to the others of its node, one direction
            (NVLink/NVSwitch, Infinity Fabric; PCIe where there is no GPU link).
        inter_node_bandwidth: bytes/s each GPU sends off its node, one direction (its share of
            the node's InfiniBand/RoCE NICs in the reference node).
        source: the datasheet (URL); note: how a figure was derived, or what is unsure.
    """

    name: str
    memory_bytes: float
    bf16_flops: float
    fp32_flops: float
    memory_bandwidth: float
    gpus_per_node: int
    intra_node_bandwidth: float
    inter_node_bandwidth: float
    source: str
    note: str = ""
    accessed: str = ACCESSED
    measured: bool = False

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s of the matmuls of a run in ``precision`` ("fp32", "bf16", "mixed")."""
        return self.fp32_flops if precision == "fp32" else self.bf16_flops


_PCIE4_X16 = 32 * GB  # PCIe 4.0 x16: 16 GT/s x 16 lanes, ~32 GB/s each way
_PCIE5_X16 = 64 * GB

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("laptop-RTX4060", 8 * GB, 2 * 11.6 * TFLOPS, 11.6 * TFLOPS, 256 * GB, 1,
        _PCIE4_X16 / 2, 0.0,
        "https://www.nvidia.com/en-us/geforce/laptops/40-series/",
        "UNSURE: NVIDIA publishes 8 GB GDDR6 on 128 bits at 16 Gbps (256 GB/s) but only 'AI "
        "TOPS' for laptops; fp32 11.6 TFLOPS is the 1890 MHz boost x 3072 cores x 2 (laptop "
        "makers set lower power, hence lower clocks); bf16 is taken as 2x fp32 (the ratio of "
        "Ada GeForce tensor cores with fp32 accumulation in the Ada whitepaper); one GPU, "
        "PCIe 4.0 x8."),
    GPU("RTX4090", 24 * GB, 165.2 * TFLOPS, 82.6 * TFLOPS, 1008 * GB, 4, _PCIE4_X16, 0.0,
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
        "Ada whitepaper appendix: BF16 tensor 165.2 TFLOPS dense with fp32 accumulate. No "
        "NVLink: GPUs talk over PCIe 4.0 x16. 4 per node and no network are a typical "
        "workstation, NOT a datasheet figure."),
    GPU("L4", 24 * GB, 121 * TFLOPS, 30.3 * TFLOPS, 300 * GB, 8, _PCIE4_X16,
        100 / 8 * GB / 8,
        "https://www.nvidia.com/en-us/data-center/l4/",
        "Datasheet: BF16 242 TFLOPS with sparsity (121 dense), FP32 30.3 TFLOPS, 300 GB/s. "
        "PCIe 4.0 only. 8 per node on a 100 Gb/s network is a typical cloud server (e.g. "
        "g2-standard-96), NOT a datasheet figure."),
    GPU("A100-40GB", 40 * GB, 312 * TFLOPS, 19.5 * TFLOPS, 1555 * GB, 8, 300 * GB, 25 * GB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        "SXM4. NVLink 600 GB/s both directions. DGX A100: 8 GPUs, 8x 200 Gb/s HDR IB "
        "(25 GB/s per GPU)."),
    GPU("A100-80GB", 80 * GB, 312 * TFLOPS, 19.5 * TFLOPS, 2039 * GB, 8, 300 * GB, 25 * GB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        "SXM4 80 GB (HBM2e 2039 GB/s). Otherwise as A100-40GB."),
    GPU("H100", 80 * GB, 989.4 * TFLOPS, 66.9 * TFLOPS, 3350 * GB, 8, 450 * GB, 50 * GB,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        "H100 SXM5. BF16 1979 TFLOPS with sparsity (989.4 dense). NVLink 900 GB/s both "
        "directions. DGX H100: 8 GPUs, 8x 400 Gb/s ConnectX-7 (50 GB/s per GPU)."),
    GPU("H200", 141 * GB, 989.4 * TFLOPS, 66.9 * TFLOPS, 4800 * GB, 8, 450 * GB, 50 * GB,
        "https://www.nvidia.com/en-us/data-center/h200/",
        "H200 SXM: the H100's compute with 141 GB HBM3e at 4.8 TB/s. DGX H200 network as DGX "
        "H100."),
    GPU("B200", 180 * GB, 2250 * TFLOPS, 80 * TFLOPS, 8000 * GB, 8, 900 * GB, 50 * GB,
        "https://www.nvidia.com/en-us/data-center/hgx/",
        "HGX B200 (1000 W): FP16/BF16 4.5 PFLOPS with sparsity (2.25 dense), FP32 80 TFLOPS, "
        "8 TB/s; DGX B200 lists 1440 GB for 8 GPUs (180 GB each; 192 GB is the chip). NVLink 5 "
        "1.8 TB/s both directions; 8x 400 Gb/s ConnectX-7. UNSURE: some pages quote 75 TFLOPS "
        "fp32."),
    GPU("MI300X", 192 * GB, 1307.4 * TFLOPS, 163.4 * TFLOPS, 5300 * GB, 8, 448 * GB, 50 * GB,
        "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        "Dense BF16 1307.4 TFLOPS (2614.9 with sparsity), FP32 vector 163.4 TFLOPS. Infinity "
        "Fabric: 7 links x 128 GB/s both directions = 896 GB/s (448 each way). 400 Gb/s per "
        "GPU is the usual platform network, NOT in AMD's datasheet."),
)}


def gpu(name: str) -> GPU:
    """The table's row ``name``; an unknown name lists the known ones."""
    if isinstance(name, GPU):
        return name
    if name not in GPUS:
        raise ValueError(f"unknown GPU {name!r}: the table knows {', '.join(GPUS)} (or "
                         "measure this machine with labkit.plan.calibrate(cluster).cluster())")
    return GPUS[name]


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of one type.

    ``gpus_per_node`` defaults to the reference node's. ``efficiency`` is the achievable
    fraction of peak FLOP/s that a well-tuned training step sustains on large matmuls: a named
    assumption, 0.5 by default (published large runs report 38-55% MFU: Megatron-LM 2021,
    Llama 3 2024); a measured cluster (this machine) sets it from its measured matmuls.
    ``alpha_s`` is each collective's fixed latency, per link kind (intra, inter): 10 and 20
    us, the order of NCCL's small-message latency (an assumption). ``op_overhead_s`` is a
    fixed cost per dispatched op (0 on GPUs, where kernels queue ahead of the device; measured
    on this machine) and ``measured_links`` each collective's fitted alpha-beta (this
    machine)."""

    gpu: GPU | str
    gpus_per_node: int | None = None
    nodes: int = 1
    efficiency: float = 0.5
    alpha_s: tuple[float, float] = (10e-6, 20e-6)
    op_overhead_s: float = 0.0
    measured_links: dict | None = dataclasses.field(default=None, compare=False, hash=False)

    def __post_init__(self):
        object.__setattr__(self, "gpu", gpu(self.gpu))
        if self.gpus_per_node is None:
            object.__setattr__(self, "gpus_per_node", self.gpu.gpus_per_node)
        for name in ("gpus_per_node", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"Cluster({name}={value!r}): a whole number, at least 1")
        if self.nodes > 1 and self.gpu.inter_node_bandwidth <= 0:
            raise ValueError(f"{self.gpu.name} rows have no network between nodes (a "
                             "workstation GPU): use nodes=1, or a data-centre GPU")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency is a fraction of peak in (0, 1], not "
                             f"{self.efficiency!r}")

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def link(self, spans_nodes: bool) -> tuple[float, float]:
        """(alpha seconds, bandwidth bytes/s) of the link a group uses."""
        if spans_nodes:
            return self.alpha_s[1], self.gpu.inter_node_bandwidth
        return self.alpha_s[0], self.gpu.intra_node_bandwidth

    def replace(self, **changes) -> Cluster:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return f"{self.nodes} x {self.gpus_per_node} {self.gpu.name}"
