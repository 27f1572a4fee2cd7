"""Accelerators and clusters the planner projects onto: one sourced table.

Every figure is the vendor's *peak* for one device (dense: no 2:4 sparsity), as printed in
the datasheet named in its row, read on the date given there. Bandwidths are bytes per second
*per GPU in one direction*: NVIDIA quotes NVLink as the sum of both directions (H100 SXM
"900 GB/s" is 450 GB/s each way), so the table halves it; an InfiniBand/RoCE NIC of 400 Gb/s
is 50 GB/s each way. Where a datasheet gives a figure only "with sparsity", the dense figure
is half of it (the datasheets' own footnote). Where a figure is not in a vendor datasheet
(GPUs per node of a workstation, the network of a node built from PCIe cards), the row says
so in ``note``: it is a typical build, not a fact about the chip. Beside the peaks, each row
keeps the fraction of its bf16 peak that matmuls reach, from a published microbenchmark
(``matmul_efficiency``, ``MAMF_SOURCE``; the sustained rate where one is published, the
A100's derived from its burst), and its SM count (``sms``: what a GEMM's waves fill,
``waves.py``): the compute rate the time model charges; and the fraction of its GPU links'
rate NCCL's collectives reach on them, measured with nccl-tests (``link_efficiency``,
``LINK_SOURCE``): the rate a collective inside a node is charged. A collective between nodes
is charged at ``NIC_EFFICIENCY`` of the NICs' rate.

``labkit.plan.GPUCluster("H100", gpus_per_node=8, nodes=4)`` names a cluster of them
(``cluster.py``); this machine's own figures are measured (``labkit.plan.calibrate``) and form
a ``GPUCluster`` of their own (``Calibration.cluster()``).
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 1e9
GiB = 2**30
MiB = 2**20
TFLOPS = 1e12
# Memory the planner leaves free on a GPU (a named assumption, ``ASSUMPTIONS`` in project.py):
# a fixed reserve for the CUDA context and cuBLAS workspaces (~0.5-1 GiB per process) and
# NCCL's channel buffers (~0.5-1 GiB), then a fraction of the rest lost to the caching
# allocator's fragmentation. A layout that needs more than ``usable_memory_bytes`` is not
# called fitting (a 79.99 GB layout on an 80 GB card would not run).
MEMORY_RESERVED_BYTES = 2 * GiB
MEMORY_FRAGMENTATION = 0.05
# Device memory figures: vendors print "80 GB" where the HBM/GDDR stacks hold 80 GiB (DRAM
# dies come in binary sizes). Where the total the driver reports is published (nvidia-smi's
# memory.total, listed for several cards in modal-labs/modal-client PR #2797, 2025-01-23,
# https://github.com/modal-labs/modal-client/pull/2797), the row uses it; else the GiB the
# stacks hold, said in the row's note.
SMI_SOURCE = "nvidia-smi memory.total, modal-labs/modal-client PR #2797"
# H200 and B200 are not in that list: their totals as nvidia-smi prints them in public logs of
# 8-GPU machines (read 2026-12-01; the same figure on every GPU of a machine and across logs)
SMI_PUBLIC = "nvidia-smi memory.total as printed in public logs (read 2026-12-01):"
ACCESSED = "2026-12-01"  # the date the datasheets below were read for this table
# Achievable matmul efficiency: the bf16 matmul TFLOP/s a GPU sustains over a step, over the
# datasheet peak. Stas Bekman's ml-engineering (github.com/stas00/ml-engineering) measures it
# with mamf-finder.py, read 2026-12-03:
# * H100/H200 SXM and B200: the sustained rate (MSMF: a matmul holding the GPU at its power
#   limit, the clock settled) is published only on the repository's unmerged branch
#   `fast-mamf` (commit 082816f, 2026-08-10), compute/accelerator/benchmarks/README.md, 'What
#   we measured: alone vs all-8 concurrent': bf16 MSMF with all 8 GPUs of the node busy
#   (n=40, the case the page says "a full-node training run will see"): H200 698.6 of 989,
#   B200 1426.4 of 2250 (torch 2.13/2.14, CUDA 13). The H100 SXM takes the H200's figure: one
#   die at the same 700 W, and master's MAMF table says of its H100 row "H200 is the same".
# * A100 SXM and MI300X: master (commit 744d01e, 2026-08-22), compute/accelerator/README.md,
#   'Maximum Achievable Matmul FLOPS comparison table', gives only MAMF, the best short burst
#   at the boost clock: A100 SXM 271.2 of 312 (torch 2.6, CUDA 12.6), MI300X 668.4 of 1300
#   (ROCm 6.3, tunable ops on). No sustained figure is published for them; on the H200 and
#   B200, MAMF sits "~15-20% above MSMF" (fast-mamf's README), so these two rows are likely
#   optimistic. No clock is assumed (no source gives the clock an A100's bf16 matmuls settle
#   at; the 1305 MHz of its HPL Rpeak is an fp64 benchmark's): the A100 takes the H100's
#   measured MAMF-to-MSMF ratio instead (A100_SUSTAINED below).
MAMF_SOURCE = ("ml-engineering (Bekman): MSMF, branch fast-mamf 082816f, "
               "compute/accelerator/benchmarks/README.md; MAMF, master 744d01e, "
               "compute/accelerator/README.md")
A100_MAMF = 271.2 / 312  # MAMF: no sustained figure published
# The A100's sustained rate: its MAMF over the drop from MAMF to MSMF measured on the H100.
# Master's table took the A100's 271.2 and the H100 SXM's 794.5 (torch 2.7, "H200 is the
# same") by one protocol (a mean of 100 iterations after 50 warm-up, per shape); the H200
# sustains 698.6 with all 8 busy (fast-mamf MSMF): 794.5 / 698.6 = 1.137. fast-mamf's README:
# the gap is "the boost->saturated clock drop" of a dense matmul drawing the card's TDP, which
# the A100 SXM reaches too (400 W). UNSURE: a transfer from the H100/H200 (the B200's same
# ratio is 1745.0 / 1426.4 = 1.223); the A100's own MSMF is not published. MI300X (another
# vendor's clocking) keeps its MAMF.
MAMF_OVER_MSMF_H100 = 794.5 / 698.6
A100_SUSTAINED = A100_MAMF / MAMF_OVER_MSMF_H100
H100_SUSTAINED = 698.6 / 989  # H200 MSMF, all 8 GPUs busy
B200_SUSTAINED = 1426.4 / 2250  # MSMF, all 8 GPUs busy
MI300X_MAMF = 668.4 / 1300  # MAMF: no sustained figure published
MATMUL_UNMEASURED = 0.5
# A fused attention kernel is not a matmul: its rate depends on the kernel, the sequence
# length and the head dimension, and each is published as forward + backward TFLOP/s on an
# H100 SXM5 at a fixed 16k tokens a batch and width 2048 (FLOPs of a causal kernel counted
# on the half it computes, backward 2.5x forward: flash-attention's benchmark_flash_attention.py,
# labkit's ``step.fused_attention_flops``). Rows without published figures time attention
# at their matmul rate (``GPU.attention_rates`` empty).
# * "fa2", FlashAttention-2 (PyTorch SDPA's flash backend, flash-attn 2): Dao 2023,
#   'FlashAttention-2', Figure 7 (H100 80GB SXM5, forward + backward), with causal mask:
#   head dim 64 and 128 at 512 .. 16k tokens (the bars' labels; the same figure is the
#   flash-attention README's assets/flash2_h100_fwd_bwd_benchmark.png, 2023-07-17).
# * "cudnn", cuDNN's fused attention (Transformer Engine's FusedAttention, which TE 1.6-1.9
#   selects over flash-attn on sm90 "for performance": transformer_engine/pytorch/
#   attention.py, v1.7): Shah et al. 2024, 'FlashAttention-3', Figure 5(d) (forward, causal,
#   head dim 128: the flash-attention README's assets/flash3_fp16_fwd.png, 2024-07-11) and
#   Figure 6 (backward, head dim 128, no causal mask: the paper publishes no causal
#   backward; UNSURE: read from a transcription of the figure, subtext.edge.nugit.net, not
#   from the PDF), combined as 3.5 / (1 / forward + 2.5 / backward).
FA2_H100_TFLOPS = {
    64: ((512, 141), (1024, 192), (2048, 232), (4096, 257), (8192, 273), (16384, 284)),
    128: ((512, 163), (1024, 221), (2048, 265), (4096, 294), (8192, 308), (16384, 328)),
}
_CUDNN_FWD_CAUSAL = ((512, 315), (1024, 410), (2048, 484), (4096, 518), (8192, 529),
                     (16384, 539))
_CUDNN_BWD = ((512, 305), (1024, 408), (2048, 465), (4096, 499), (8192, 518), (16384, 516))
CUDNN_H100_TFLOPS = {128: tuple((seq, 3.5 / (1 / fwd + 2.5 / bwd)) for (seq, fwd), (_, bwd)
                                in zip(_CUDNN_FWD_CAUSAL, _CUDNN_BWD, strict=True))}
ATTENTION_SOURCE = ("Dao 2023 (FlashAttention-2) Figure 7; Shah et al. 2024 "
                    "(FlashAttention-3) Figures 5(d) and 6: H100 SXM5, TFLOP/s")


def _fractions(table: dict, peak_tflops: float) -> tuple:
    """((head dim, ((seq, fraction of the bf16 peak), ...)), ...) of a TFLOP/s table."""
    return tuple((d, tuple((seq, t / peak_tflops) for seq, t in rows))
                 for d, rows in sorted(table.items()))


H100_ATTENTION = (("fa2", _fractions(FA2_H100_TFLOPS, 989.4)),
                  ("cudnn", _fractions(CUDNN_H100_TFLOPS, 989.4)))


# torchtitan's Grand Teton H100s run at a 500 W limit, and torchtitan's performance page
# says their peak lies "between SXM and NVL": the H100 NVL's dense bf16 peak, 835.5 TFLOP/s
# (1,671 with sparsity, NVIDIA's H100 datasheet), over the SXM's 989.4 bounds it from below.
# No bf16 matmul measurement at 500 W is published: the row takes that lower bound.
H100_500W = 835.5 / 989.4
# Compute that runs beside a collective runs slower: NCCL's kernels take SMs and memory
# bandwidth. Measured on A100, H100, MI250 and MI210 over GPT and Llama training kernels:
# "an average computational slowdown of 18.9%, with a maximum of 40.0%" (Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning, arXiv
# 2507.03114, abstract). ``project`` charges it on the compute a hidden collective overlaps.
# The runs measured were of GPUs in one node; the planner charges it beside collectives over
# the network too: NCCL runs those as kernels on the SMs as well, a CUDA block per channel
# (NCCL's environment-variable docs, NCCL_MIN_NCHANNELS: more channels use "more CUDA compute
# resources"), the kernels reducing and copying every chunk that the NIC sends or receives.
OVERLAP_SLOWDOWN = 0.189
OVERLAP_SOURCE = "arXiv 2507.03114 (compute-communication overlap characterized): 18.9% mean"
# What NCCL achieves over a node's GPU links, over their one-direction spec: nccl-tests' bus
# bandwidth (busbw: the rate a ring's time model divides by, labkit.runtime.costs.ring_share)
# and nvbandwidth's pairwise copy, at 16 GiB (Bekman, ml-engineering network/README.md,
# sections 'NVLink', 'SHARP' and 'Intra-node networking'; master 744d01e, read 2026-12-03):
# * NVLink 4 (8x H200 on NVSwitch, the H100's fabric): ring all-reduce 367.2 (NVLS off),
#   all-gather 361.4, reduce-scatter 362.9 GB/s of 450; a pairwise copy 396.4.
# * NVLink 3 (8x A100): all-reduce 234.89 of 300. NVLink 5 (8x B200): ring all-reduce 682.2
#   of 900. MI300X (8 GPUs, 7 links of 64 GB/s): all-reduce 312.9 of 448.
# A kind a row does not list takes its ring all-reduce's fraction (the same ring: on NVLink 4
# the three collectives land within 2%). NCCL's NVLS all-reduce (NVLink SHARP: 480 GB/s
# busbw on 8 H200s) is not assumed: all-reduce only, over more than 4 GPUs of an NVSwitch
# node, NCCL >= 2.17.
# Between nodes, the one published measurement of NCCL over a node's NICs (same README,
# 'Inter-node speed depends on intra-node speed', torch 2.9.1, NCCL 2.27.7; read 2026-12-03):
# a 16 GiB all-reduce over 4 P6-B200 nodes (8 GPUs each, 8x 50 GB/s EFA v4) reaches 381.80
# GB/s busbw. A ring over nodes with 8 members in each is charged on the node's 8 NICs (400
# GB/s: ``GPUCluster.link``), so on that model NCCL reached 381.80 / 400 of the NICs' rate,
# the figure charged on every network link (as NVLink 4's is on the H100's). The README's
# "~73% of wire rate" is the same run counted the hierarchical way (only the 0.75 GiB shard
# of a 4 GiB payload crosses each NIC); charged on the ring's bytes it would make that
# measured all-reduce 29% slower than it ran. The page warns the figure is a property of that
# node type.
NIC_EFFICIENCY = 381.80 / (8 * 50)
NVLINK4 = (("all_reduce", 367.2 / 450), ("all_gather", 361.4 / 450),
           ("reduce_scatter", 362.9 / 450), ("send", 396.4 / 450))
NVLINK3 = (("all_reduce", 234.89 / 300),)
NVLINK5 = (("all_reduce", 682.2 / 900),)
INFINITY_FABRIC = (("all_reduce", 312.912 / (7 * 64)),)
# SMs per GPU (Bekman, ml-engineering compute/accelerator/README.md, cache table, master
# 744d01e, after NVIDIA's Ampere and Hopper tuning guides): A100 SXM 108, H100 and H200 SXM 132.
SM_SOURCE = "ml-engineering compute/accelerator/README.md (NVIDIA tuning guides)"
A100_SMS, HOPPER_SMS = 108, 132
LINK_SOURCE = ("ml-engineering network/README.md (Bekman; master 744d01e): nccl-tests busbw, "
               "nvbandwidth, all_reduce_bench.py over 4 B200 nodes")


@dataclass(frozen=True)
class GPU:
    """One accelerator's peak figures (dense), per device.

    Attributes:
        name: the key of the table ("H100").
        memory_bytes: device memory.
        bf16_flops, fp32_flops: dense peak FLOP/s: bf16 on the matrix units (tensor cores)
            with fp32 accumulation; fp32 without them (no TF32).
        memory_bandwidth: device-memory bytes/s.
        gpus_per_node: GPUs in the vendor's reference node (DGX/HGX, the MI300X platform):
            the most one node's GPU links join (``GPUCluster`` refuses more unless told).
        intra_node_bandwidth: bytes/s each GPU sends to the others of its node, one direction
            (NVLink/NVSwitch, Infinity Fabric; PCIe where there is no GPU link). With
            ``peer_links`` (a fully connected node, no switch) it is ONE link's: a GPU reaches
            each peer over its own link, so a group of g uses g-1 of them.
        peer_links: links per GPU in a fully connected node (0: a switch, any peer at the
            full ``intra_node_bandwidth``).
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
    peer_links: int = 0
    # achievable fraction of the bf16 peak on large matmuls (MAMF_SOURCE above)
    matmul_efficiency: float = MATMUL_UNMEASURED
    # ((kernel, ((head dim, ((seq, fraction of the bf16 peak), ...)), ...)), ...): fused
    # attention kernels' published rates (ATTENTION_SOURCE); empty: the matmul rate
    attention_rates: tuple = ()
    # what those rates are scaled by on this row (a power-capped card: H100_500W)
    attention_scale: float = 1.0
    # ((collective kind, fraction of the GPU links' rate NCCL achieves), ...): LINK_SOURCE;
    # empty: the datasheet rate
    link_efficiency: tuple[tuple[str, float], ...] = ()
    # streaming multiprocessors (SM_SOURCE): the GEMMs' waves (waves.py); 0: not corrected
    sms: int = 0

    @property
    def usable_memory_bytes(self) -> float:
        """What a training step may use: the capacity less ``MEMORY_RESERVED_BYTES`` and
        ``MEMORY_FRAGMENTATION`` of it (a measured machine's cap is all usable: labkit
        enforces it on the tensors alone)."""
        if self.measured:
            return self.memory_bytes
        return self.memory_bytes * (1 - MEMORY_FRAGMENTATION) - MEMORY_RESERVED_BYTES

    def group_bandwidth(self, group: int, kind: str) -> float:
        """Bytes/s one GPU sends in a ``kind`` collective over ``group`` GPUs of its node."""
        if not self.peer_links:
            return self.intra_node_bandwidth
        links = 1 if kind == "send" else min(max(group - 1, 1), self.peer_links)
        return links * self.intra_node_bandwidth

    def achieved_bandwidth(self, group: int, kind: str) -> float:
        """Bytes/s a ``kind`` collective over ``group`` GPUs of one node achieves: the links'
        rate (``group_bandwidth``) times the fraction NCCL was measured to reach on them
        (``link_efficiency``: the kind's, else the ring all-reduce's, else the whole rate)."""
        measured = dict(self.link_efficiency)
        return self.group_bandwidth(group, kind) * measured.get(kind,
                                                                measured.get("all_reduce", 1.0))

    def attention_efficiency(self, kernel: str, seq: int, head_dim: int) -> float | None:
        """The fraction of the bf16 peak a fused attention ``kernel`` ("fa2", "cudnn")
        reaches forward + backward at ``seq`` tokens and ``head_dim``: the published point at
        the nearest head dimension and the longest published sequence not above ``seq``
        (the shortest, below them all); None where the row has no figure for the kernel."""
        tables = dict(self.attention_rates).get(kernel)
        if not tables:
            return None
        _, rows = min(tables, key=lambda t: (abs(t[0] - head_dim), -t[0]))
        below = [f for s, f in rows if s <= seq]
        return (below[-1] if below else rows[0][1]) * self.attention_scale

    def peak_flops(self, precision: str) -> float:
        """Peak FLOP/s of the matmuls of a run in ``precision`` ("fp32", "bf16", "mixed",
        "fp16"): every row's dense fp16 tensor rate equals its bf16 rate (its datasheet)."""
        return self.fp32_flops if precision == "fp32" else self.bf16_flops


_PCIE4_X16 = 32 * GB  # PCIe 4.0 x16: 16 GT/s x 16 lanes, ~32 GB/s each way
_PCIE5_X16 = 64 * GB

GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("laptop-RTX4060", 8 * GiB, 2 * 11.6 * TFLOPS, 11.6 * TFLOPS, 256 * GB, 1,
        _PCIE4_X16 / 2, 0.0,
        "https://www.nvidia.com/en-us/geforce/laptops/40-series/",
        "8 GB read as 8 GiB (the GDDR6 dies' size). UNSURE: NVIDIA publishes 8 GB GDDR6 on 128 "
        "bits at 16 Gbps (256 GB/s) but only 'AI "
        "TOPS' for laptops; fp32 11.6 TFLOPS is the 1890 MHz boost x 3072 cores x 2 (laptop "
        "makers set lower power, hence lower clocks); bf16 is taken as 2x fp32 (the ratio of "
        "Ada GeForce tensor cores with fp32 accumulation in the Ada whitepaper); one GPU, "
        "PCIe 4.0 x8."),
    GPU("RTX4090", 24 * GiB, 165.2 * TFLOPS, 82.6 * TFLOPS, 1008 * GB, 4, _PCIE4_X16, 0.0,
        "https://images.nvidia.com/aem-dam/Solutions/geforce/ada/nvidia-ada-gpu-architecture.pdf",
        "24 GB read as 24 GiB (12 x 16 Gbit GDDR6X). Ada whitepaper appendix: BF16 tensor 165.2 "
        "TFLOPS dense with fp32 accumulate. No "
        "NVLink: GPUs talk over PCIe 4.0 x16. 4 per node and no network are a typical "
        "workstation, NOT a datasheet figure."),
    GPU("L4", 23034 * MiB, 121 * TFLOPS, 30.3 * TFLOPS, 300 * GB, 8, _PCIE4_X16,
        100 / 8 * GB / 8,
        "https://www.nvidia.com/en-us/data-center/l4/",
        f"Memory: {SMI_SOURCE} (24 GB, ECC on). Datasheet: BF16 242 TFLOPS with sparsity (121 "
        "dense), FP32 30.3 TFLOPS, 300 GB/s. "
        "PCIe 4.0 only. 8 per node on a 100 Gb/s network is a typical cloud server (e.g. "
        "g2-standard-96), NOT a datasheet figure."),
    GPU("A100-40GB", 40960 * MiB, 312 * TFLOPS, 19.5 * TFLOPS, 1555 * GB, 8, 300 * GB, 25 * GB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        f"Memory: {SMI_SOURCE} (40 GiB). SXM4. NVLink 600 GB/s both directions. DGX A100: 8 "
        "GPUs, 8x 200 Gb/s HDR IB "
        "(25 GB/s per GPU). Matmuls: the A100 SXM's MAMF over the H100's MAMF-to-MSMF drop "
        "(A100_SUSTAINED; UNSURE). Links: NCCL's measured all-reduce on NVLink 3 (NVLINK3).",
        matmul_efficiency=A100_SUSTAINED, link_efficiency=NVLINK3, sms=A100_SMS),
    GPU("A100-80GB", 81920 * MiB, 312 * TFLOPS, 19.5 * TFLOPS, 2039 * GB, 8, 300 * GB, 25 * GB,
        "https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
        "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        f"Memory: {SMI_SOURCE} (80 GiB). SXM4 80 GB (HBM2e 2039 GB/s). Otherwise as A100-40GB.",
        matmul_efficiency=A100_SUSTAINED, link_efficiency=NVLINK3, sms=A100_SMS),
    GPU("H100", 81559 * MiB, 989.4 * TFLOPS, 66.9 * TFLOPS, 3350 * GB, 8, 450 * GB, 50 * GB,
        "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet",
        f"Memory: {SMI_SOURCE} (85.5e9 bytes: 80 GiB of HBM3 less what the driver keeps). "
        "H100 SXM5. BF16 1979 TFLOPS with sparsity (989.4 dense). NVLink 900 GB/s both "
        "directions. DGX H100: 8 GPUs, 8x 400 Gb/s ConnectX-7 (50 GB/s per GPU). Matmuls: "
        "the H100/H200 SXM sustained rate (MSMF); fused attention at its published rates "
        "(H100_ATTENTION). "
        "Links: NCCL's measured rates on NVLink 4 (NVLINK4).",
        matmul_efficiency=H100_SUSTAINED, attention_rates=H100_ATTENTION,
        link_efficiency=NVLINK4, sms=HOPPER_SMS),
    GPU("H100-96GB", 96 * GiB, 989.4 * TFLOPS, 66.9 * TFLOPS, 2400 * GB, 8, 450 * GB, 50 * GB,
        "https://github.com/pytorch/torchtitan/blob/main/docs/performance.md",
        "The H100 SXM with 96 GB of HBM2e at 2.4 TB/s (Meta's Grand Teton, as torchtitan's "
        "performance page describes it), 400 Gb/s per GPU. 96 GB read as 96 GiB. At its "
        "500 W limit the peak lies between the SXM's and the NVL's (torchtitan's note): the "
        "peak printed is the SXM's (MFU's denominator, as torchtitan's), the rates charged are "
        "the SXM's sustained matmul and fused attention rates scaled by NVL/SXM peak "
        "(H100_500W, the bound's low end). UNSURE: no bf16 measurement at 500 W is published; "
        "132 SMs taken as the SXM's (the same die).",
        matmul_efficiency=H100_SUSTAINED * H100_500W,
        attention_rates=H100_ATTENTION, attention_scale=H100_500W, link_efficiency=NVLINK4,
        sms=HOPPER_SMS),
    GPU("H200", 143771 * MiB, 989.4 * TFLOPS, 66.9 * TFLOPS, 4800 * GB, 8, 450 * GB, 50 * GB,
        "https://www.nvidia.com/en-us/data-center/h200/",
        f"Memory: {SMI_PUBLIC} 143771 MiB on H200 SXM (driver 570.158.01; 140.4 GiB). H200 "
        "SXM: the H100's compute with 141 GB HBM3e at 4.8 TB/s. DGX H200 network as DGX "
        "H100. Matmuls: the H200's sustained rate (MSMF); fused attention as on the H100. "
        "Links: NVLINK4 (measured on 8 H200s).",
        matmul_efficiency=H100_SUSTAINED, attention_rates=H100_ATTENTION,
        link_efficiency=NVLINK4, sms=HOPPER_SMS),
    GPU("B200", 183359 * MiB, 2250 * TFLOPS, 80 * TFLOPS, 8000 * GB, 8, 900 * GB, 50 * GB,
        "https://www.nvidia.com/en-us/data-center/hgx/",
        f"Memory: {SMI_PUBLIC} 183359 MiB on B200 (179.1 GiB). HGX B200 (1000 W): FP16/BF16 "
        "4.5 PFLOPS with "
        "sparsity (2.25 dense), FP32 80 TFLOPS, "
        "8 TB/s; DGX B200 lists 1440 GB for 8 GPUs (180 GB each; 192 GB is the chip). NVLink 5 "
        "1.8 TB/s both directions; 8x 400 Gb/s ConnectX-7. UNSURE: some pages quote 75 TFLOPS "
        "fp32. Matmuls: the B200's sustained rate (MSMF). Links: NVLINK5.",
        matmul_efficiency=B200_SUSTAINED, link_efficiency=NVLINK5),
    GPU("MI300X", 192 * GiB, 1307.4 * TFLOPS, 163.4 * TFLOPS, 5300 * GB, 8, 64 * GB, 50 * GB,
        "https://www.amd.com/en/products/accelerators/instinct/mi300/mi300x.html",
        "192 GB read as 192 GiB (8 HBM3 stacks of 24 GiB). Dense BF16 1307.4 TFLOPS (2614.9 "
        "with sparsity), FP32 vector 163.4 TFLOPS. Infinity Fabric: 7 links per GPU, 128 GB/s "
        "each both directions (64 GB/s each way), one to each peer of the 8-GPU platform (no "
        "switch): a GPU reaches ONE peer at 64 GB/s and a collective over g GPUs uses g-1 "
        "links (all 8: 448 GB/s each way). 400 Gb/s per GPU is the usual platform network, "
        "NOT in AMD's datasheet. Matmuls: MAMF (ROCm 6.3). Links: INFINITY_FABRIC (8 GPUs).",
        peer_links=7, matmul_efficiency=MI300X_MAMF, link_efficiency=INFINITY_FABRIC),
)}


def gpu(name: str) -> GPU:
    """The table's row ``name``; an unknown name lists the known ones."""
    if isinstance(name, GPU):
        return name
    if name not in GPUS:
        close = [k for k in GPUS if k.lower().startswith(str(name).lower())]
        if close:
            raise ValueError(f"GPU {name!r} names {len(close)} rows of the table: "
                             f"{', '.join(close)}; give one of them (memory differs)")
        raise ValueError(f"unknown GPU {name!r}: the table knows {', '.join(GPUS)} (or "
                         "measure this machine with labkit.plan.calibrate(cluster).cluster())")
    return GPUS[name]
