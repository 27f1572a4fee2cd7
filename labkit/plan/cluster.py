"""A cluster the planner projects onto: ``nodes`` nodes of one GPU row of ``hardware.py``,
with the links between them and (for this machine) its measured figures."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from labkit.plan.hardware import GPU, NIC_EFFICIENCY, gpu

# collectives NCCL runs as rings, which cross a node boundary at a few GPUs per channel
RINGS = ("all_reduce", "all_gather", "reduce_scatter")


@dataclass(frozen=True)
class GPUCluster:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of one type.

    ``gpus_per_node`` defaults to the reference node's. ``efficiency`` is the achievable
    fraction of peak FLOP/s on large matmuls: None takes the GPU row's ``matmul_efficiency``
    (a microbenchmark's, ``MAMF_SOURCE``); a measured cluster (this machine) sets it from its
    measured matmuls. Everything else a step does (memory-bound ops, exposed communication,
    the pipeline's bubble) is charged on top of it, not folded into it.
    ``network_gbps``: the network each GPU has off its node, in Gb/s one direction (the
    cluster's own NICs; None: the reference node's, ``GPU.inter_node_bandwidth``).
    ``alpha_s`` is the latency of one step of a ring (one message), per link kind (intra,
    inter): 10 and 20 us, the order of NCCL's small-message latency (an assumption); a
    collective pays it once per step (2(N-1) for AllReduce: ``labkit.runtime.costs.ring_steps``).
    ``custom_node`` allows more GPUs per node than the reference node joins. ``op_overhead_s`` is a
    fixed cost per dispatched op (0 on GPUs, where kernels queue ahead of the device; measured
    on this machine) and ``measured_links`` each collective's fitted alpha-beta (this
    machine); ``engine_overhead_s`` what tp and fsdp add per parameter tensor (this machine
    only)."""

    gpu: GPU | str
    gpus_per_node: int | None = None
    nodes: int = 1
    efficiency: float | None = None
    alpha_s: tuple[float, float] = (10e-6, 20e-6)
    op_overhead_s: float = 0.0
    measured_links: dict | None = dataclasses.field(default=None, compare=False, hash=False)
    # ((engine, seconds per parameter tensor), ...): what tp's DTensors and
    # FSDP2's hooks add to each op (measured on this machine: labkit/plan/engines.py); empty
    # on GPUs, where no such figure is measured (kernels queue ahead of the device)
    engine_overhead_s: tuple = ()
    custom_node: bool = False
    # what meeting in collectives adds to a multi-rank step's compute, as a fraction of it
    # (measured on this machine: labkit/plan/jitter.py); 0 on GPUs
    sync_jitter: float = 0.0
    network_gbps: float | None = None

    def __post_init__(self):
        object.__setattr__(self, "gpu", gpu(self.gpu))
        if self.efficiency is None:
            object.__setattr__(self, "efficiency", self.gpu.matmul_efficiency)
        if self.network_gbps is not None and not self.network_gbps > 0:
            raise ValueError(f"network_gbps is each GPU's network in Gb/s, more than 0, not "
                             f"{self.network_gbps!r}")
        if self.gpus_per_node is None:
            object.__setattr__(self, "gpus_per_node", self.gpu.gpus_per_node)
        for name in ("gpus_per_node", "nodes"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"GPUCluster({name}={value!r}): a whole number, at least 1")
        if self.gpus_per_node > self.gpu.gpus_per_node and not self.custom_node:
            raise ValueError(
                f"{self.gpu.name} nodes join at most {self.gpu.gpus_per_node} GPUs on their GPU "
                f"links (the reference node); gpus_per_node={self.gpus_per_node} would put "
                f"GPUs on links the table does not have: use gpus_per_node <= "
                f"{self.gpu.gpus_per_node} and more nodes, or custom_node=True to assume a "
                "bigger node with the same per-GPU links")
        if self.nodes > 1 and self.inter_node_bandwidth <= 0:
            raise ValueError(f"{self.gpu.name} rows have no network between nodes (a "
                             "workstation GPU): use nodes=1, or a data-centre GPU")
        if not 0 < self.efficiency <= 1:
            raise ValueError(f"efficiency is a fraction of peak in (0, 1], not "
                             f"{self.efficiency!r}")

    @property
    def inter_node_bandwidth(self) -> float:
        """Bytes/s each GPU sends off its node, one direction."""
        if self.network_gbps is not None:
            return self.network_gbps * 1e9 / 8
        return self.gpu.inter_node_bandwidth

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def link(self, spans_nodes: bool, group: int = 2, kind: str = "all_reduce",
             per_node: int = 1) -> tuple[float, float]:
        """(alpha seconds per ring step, bandwidth bytes/s) of the link a ``kind`` collective
        over ``group`` GPUs uses: the node's GPU links at the rate NCCL was measured to reach
        on them (``GPU.achieved_bandwidth``), or the network at the fraction of its NICs' rate
        NCCL was measured to reach over nodes (``NIC_EFFICIENCY``). A group with ``per_node``
        members in each node crosses it on that many NICs at once (NCCL's channels cross the
        node boundary at different GPUs: Bekman, ml-engineering network/README.md, 'Inter-node
        speed depends on intra-node speed', where one GPU's NIC carrying the whole payload is
        "the arithmetic to avoid", 3.9x off a measured 32-rank all-reduce), and never faster
        than the ring's hops inside the node. That holds for the ring collectives
        (``RINGS``); in a send or an all-to-all every GPU's own bytes leave on its own NIC."""
        nic = self.inter_node_bandwidth * NIC_EFFICIENCY
        if spans_nodes and kind in RINGS and per_node > 1:
            return self.alpha_s[1], min(per_node * nic,
                                        self.gpu.achieved_bandwidth(per_node, kind))
        if spans_nodes:  # a send, an all-to-all: each GPU's own bytes leave on its own NIC
            return self.alpha_s[1], nic
        return self.alpha_s[0], self.gpu.achieved_bandwidth(group, kind)

    def replace(self, **changes) -> GPUCluster:
        return dataclasses.replace(self, **changes)

    def __str__(self) -> str:
        return f"{self.nodes} x {self.gpus_per_node} {self.gpu.name}"
