"""The time model: one layout's step on a cluster, from the step's counted costs.

    step = compute + exposed communication + pipeline bubble

* compute: FLOPs / (peak x efficiency) + memory-bound bytes / memory bandwidth. Efficiency is
  the GPU's matmul rate over its peak, from a microbenchmark (sustained where published;
  ``hardware.py``:
  ``GPU.matmul_efficiency``; measured matmuls on this machine), never an end-to-end MFU:
  everything else below is charged on top of it. A fused attention kernel runs at its own
  published rate at the run's sequence length and head dimension (FlashAttention-2's, or
  cuDNN's under Transformer Engine: 27-33% and 48-53% of an H100's peak at 2k-8k tokens;
  ``GPU.attention_rates``).
  Compute beside a hidden collective runs ``OVERLAP_SLOWDOWN`` (18.9%) slower (NCCL's
  kernels take SMs, in a node or over the network: ``hardware.py``). A pipeline's compute
  is its busiest stage's (``step.step_flops``).
* communication: each (mesh dimension, collective) costs calls x ring steps x alpha + what a
  rank sends on a ring / bandwidth (``labkit.runtime.costs.ring_share``), on the link its group
  uses: a group whose ranks sit in one node (tp is innermost, so tp groups do when tp <= GPUs per
  node) uses the node's GPU links, any other the network (at ``NIC_EFFICIENCY`` of its NICs'
  rate): a ring collective on as many NICs as the group has members in a node
  (``members_per_node``; ``GPUCluster.link``).
* overlap, as the run's framework does it (``frameworks.py``): DDP's AllReduce runs during
  backward (buckets), so only what outlasts backward is exposed, and never less than its last
  bucket (Megatron-Core's distributed optimizer: reduce-scatters under backward, parameter
  all-gathers under the next forward; Megatron 2021 and DeepSpeed's pipeline reduce after
  backward: exposed whole); a reduction done once a step runs in the last micro-batch's
  backward only, the parameter gathers in the first micro-batch's forward
  (``overlap.hiding_window_s``);
  FSDP's all-gathers and reduce-scatters likewise during forward and backward; tensor
  parallelism is exposed unless the framework overlaps it (Megatron-Core); pipeline sends
  are exposed.
* bubble: a pipeline of p stages and m micro-batches idles (p-1)/v micro-batch times per step
  (v = stages per rank: 2 for interleaved 1F1B; GPipe and 1F1B both lose (p-1)).
"""

from __future__ import annotations

import functools
import math

from labkit.plan.cluster import GPUCluster
from labkit.plan.counts import (
    forward_backward_ops,
    is_decoder,
    is_recommender,
    optimizer_counts,
    param_tensors,
)
from labkit.plan.frameworks import framework
from labkit.plan.hardware import OVERLAP_SLOWDOWN
from labkit.plan.overlap import exposed_s
from labkit.plan.parallelism import Parallelism, parallelism
from labkit.plan.projection import ASSUMPTIONS, Projection
from labkit.plan.recommender import recommender_memory
from labkit.plan.step import (
    Lever,
    StepCosts,
    compute_bytes,
    decoder_memory,
    fused_attention_flops,
    local_params,
    step_comm,
    step_flops,
)
from labkit.plan.traffic import memory_bound_bytes
from labkit.plan.waves import gemm_efficiency
from labkit.runtime.costs import ring_share, ring_steps
from labkit.training.layout.layout import MESH_ORDER, Layout


def spans_nodes(layout: Parallelism, dim: str, gpus_per_node: int) -> bool:
    """Whether ``dim``'s groups reach past one node (ranks are numbered tp innermost)."""
    order = list(MESH_ORDER)
    stride = math.prod(getattr(layout, d) for d in order[order.index(dim) + 1:])
    span = stride * getattr(layout, dim)  # consecutive ranks one group's members reach over
    # a span that does not divide the node leaves some groups straddling two nodes
    return span > gpus_per_node or gpus_per_node % span != 0


def members_per_node(layout: Parallelism, dim: str, gpus_per_node: int) -> int:
    """Members of one ``dim`` group that share a node (ranks numbered tp innermost)."""
    order = list(MESH_ORDER)
    stride = math.prod(getattr(layout, d) for d in order[order.index(dim) + 1:])
    return max(1, min(getattr(layout, dim), gpus_per_node // stride))


def _collective_s(cluster: GPUCluster, kind: str, group: int, calls: int, nbytes: float,
                  spans: bool, per_node: int = 1) -> float:
    """``calls`` collectives moving ``nbytes`` in all: each pays alpha per ring step
    (``labkit.runtime.costs.collective_seconds``), the bytes pay the bandwidth once."""
    fitted = getattr(cluster, "measured_links", None)
    if fitted:  # this machine: each collective's own alpha (per step) and beta
        fit = fitted.get(kind) or fitted["all_reduce"]
        alpha, bandwidth = fit.latency_per_step, fit.bandwidth
    else:
        alpha, bandwidth = cluster.link(spans, group, kind, per_node)
    return calls * ring_steps(kind, group) * alpha + ring_share(kind, group) * nbytes / bandwidth


@functools.lru_cache(maxsize=4096)
def step_costs(model_config, layout: Parallelism, lever: Lever, measured: bool = False,
               flash_attention: bool = True) -> StepCosts:
    """The counted costs of one step on the worst rank (cached per layout)."""
    flops, model_flops = step_flops(model_config, layout, lever)
    attention = fused_attention_flops(model_config, layout, lever) if not measured else 0.0
    params = local_params(model_config, layout, lever.framework)
    tokens = lever.global_batch * getattr(model_config, "seq_len", 1)
    if is_decoder(model_config):
        memory = decoder_memory(model_config, layout, lever, measured, flash_attention)
        method = "counted per block, scaled"
    elif is_recommender(model_config):
        memory = recommender_memory(model_config, layout, lever)
        method = "tables per rank counted from the plan"
    else:
        memory, method = traced_memory(model_config, layout, lever)
    memory_bound = memory_bound_bytes(model_config, layout, lever, memory["parameters"],
                                      memory["gradients"])
    comm = step_comm(model_config, layout, lever, params, measured)
    return StepCosts(flops, model_flops, memory_bound, memory, comm, lever.global_batch,
                     tokens, method, attention)


def traced_memory(model_config, layout: Parallelism, lever: Lever) -> tuple[dict, str]:
    """Peak by category from ``estimate_memory`` (fake tensors, the real engines)."""
    from labkit.training.config import TrainConfig
    from labkit.training.estimate import estimate_memory

    config = TrainConfig(model=model_config, **layout.config_fields(),
                         global_batch=lever.global_batch,
                         micro_batches=lever.micro_batches if layout.pipelined else 1,
                         grad_accumulation=1 if layout.pipelined else lever.micro_batches,
                         precision=lever.precision, optimizer=lever.optimizer,
                         activation_checkpointing=lever.activation_checkpointing)
    estimate = estimate_memory(config, layout.size)
    return {k: float(v) for k, v in estimate.at_peak.items()}, "traced on fake tensors"


def project(model_config, layout: Layout | Parallelism, cluster: GPUCluster, global_batch: int,
            micro_batches: int = 1, precision: str = "mixed",
            activation_checkpointing: bool = False, optimizer: str = "adam", *,
            selective_recompute: bool = False, sequence_parallel: bool = False,
            zero_stage: int = 0, flash_attention: bool | None = None,
            framework: str = "labkit", virtual_stages: int = 0) -> Projection:
    """Project one training step of ``model_config`` with ``layout`` on ``cluster``.

    ``selective_recompute``, ``sequence_parallel``: Korthikanti et al. 2022's levers (tp);
    ``zero_stage``: 1 or 2 shards the optimizer state (and gradients) over the dp replicas
    beside tp and pp (Megatron's distributed optimizer, DeepSpeed's ZeRO); ``flash_attention``
    None: a fused kernel on GPUs, the math path on this machine; ``framework``: whose
    defaults the run has (``labkit.plan.frameworks.FRAMEWORKS``); ``virtual_stages``: model
    chunks per pipeline rank for interleaved 1F1B, any v >= 2 (the bubble is (p-1)/v
    micro-batch times and each micro-batch crosses v times as many stage boundaries)."""
    from labkit.plan.rules import check_layout, warn_tokens_as_batch

    layout = parallelism(layout)  # a Layout: its engines' defaults
    warn_tokens_as_batch(model_config, global_batch)
    measured = cluster.gpu.measured
    flash = (not measured) if flash_attention is None else bool(flash_attention)
    lever = Lever(global_batch, micro_batches, precision, activation_checkpointing, optimizer,
                  selective_recompute, sequence_parallel, zero_stage, flash, framework,
                  virtual_stages)
    check_layout(model_config, layout, cluster, lever)
    costs = step_costs(model_config, layout, lever, measured, flash)
    return _time(model_config, layout, cluster, lever, costs)


# A fused attention kernel's rate against FlashAttention-2's (the GPU row's published figure).
# llm-foundry's attn_impl "triton" (llmfoundry/models/layers/flash_attn_triton.py, v0.3.0) is
# Dao's flash_attn_triton.py for pre-MLIR Triton, whose docstring says "Overall Triton
# forward + backward is slightly slower than CUDA forward + backward": FlashAttention-1's
# CUDA kernel, which FlashAttention-2 outruns 1.7-3.0x (Dao 2023, 'FlashAttention-2',
# section 4.1, A100; pre-MLIR Triton has no Hopper instructions, FA2 none either): the least
# is taken. (The same section's 1.3-2.5x is over its "FlashAttention in Triton" baseline,
# which it does not name as this kernel; the kernel's own docstring places it beside FA1.)
ATTENTION_SLOWER = {"fa2": 1.0, "triton": 1.7}
# The published kernel each framework's attention_kernel is timed by (``hardware.GPU
# .attention_rates``): Transformer Engine's "fused" is cuDNN's on Hopper (TE 1.6-1.9 select
# it over flash-attn on sm90); Triton's against FA2's.
ATTENTION_KERNELS = {"fa2": "fa2", "triton": "fa2", "fused": "cudnn"}


def _matmul_s(cluster: GPUCluster, lever: Lever, costs: StepCosts, model_config=None,
              layout: Parallelism | None = None) -> float:
    """Seconds of the step's FLOPs: the matmuls at the sustained matmul rate, less what
    their shapes lose to tile and wave quantization (``waves.gemm_efficiency``, where the
    model and layout are given), a fused attention kernel's at its own published rate at the
    model's sequence length and head dimension (FlashAttention-2's or cuDNN's,
    ``ATTENTION_KERNELS``; a slower kernel's against it, ``ATTENTION_SLOWER``), where the
    GPU's row has one."""
    gpu = cluster.gpu
    peak = gpu.peak_flops(lever.precision)
    attention = costs.attention_flops  # a fused kernel's: not GEMMs of the linears' shapes
    rate = peak * cluster.efficiency
    if model_config is not None and layout is not None:
        tokens = (lever.global_batch // layout.data_size // lever.micro_batches
                  * getattr(model_config, "seq_len", 1) // layout.cp)
        rate *= gemm_efficiency(model_config, layout.tp, tokens, gpu.sms,
                                framework(lever.framework).vocab_parallel, bool(attention))
    kernel = framework(lever.framework).attention_kernel
    fused = peak * cluster.efficiency  # no published rate: the matmul rate
    published = (gpu.attention_efficiency(ATTENTION_KERNELS[kernel], model_config.seq_len,
                                          model_config.d_head)
                 if attention and model_config is not None and kernel in ATTENTION_KERNELS
                 else None)
    if published:
        fused = peak * published / ATTENTION_SLOWER.get(kernel, 1.0)
    return (costs.flops - attention) / rate + attention / fused


def _time(model_config, layout, cluster, lever, costs) -> Projection:
    """Time one step from its counted costs: compute, each dimension's busy and exposed
    communication, the pipeline's bubble (the module docstring's model)."""
    compute = _compute_s(model_config, layout, cluster, lever, costs)
    busy, links, critical, by_kind = _busy_s(layout, cluster, lever, costs)
    exposed = exposed_s(layout, cluster, lever, costs, compute, busy, critical, by_kind)
    if not cluster.gpu.measured:
        # compute beside a hidden collective runs slower (NCCL's kernels take SMs), in a
        # node or over the network (``hardware.OVERLAP_SLOWDOWN``)
        hidden = sum(busy[d] - exposed[d] for d in busy)
        compute += OVERLAP_SLOWDOWN * min(hidden, compute)
    bubble = 0.0
    if layout.pipelined and layout.pp > 1:
        per_micro = (compute + exposed.get("tp", 0.0)) / lever.micro_batches
        bubble = (layout.pp - 1) / chunks_per_rank(layout, lever) * per_micro
    return Projection(model_config, layout, cluster, lever, costs, compute, busy, exposed,
                      bubble, links)


def _compute_s(model_config, layout, cluster, lever, costs) -> float:
    """Seconds of compute on the busiest rank: matmuls, bandwidth-bound bytes, and (this
    machine) the per-op and per-tensor overheads and the ranks' jitter."""
    compute = (_matmul_s(cluster, lever, costs, model_config, layout)
               + costs.memory_bound_bytes / cluster.gpu.memory_bandwidth
               + (cluster.op_overhead_s * _ops(model_config, layout, lever)
                  if cluster.op_overhead_s else 0.0)  # GPUs: 0, and no op count to trace
               + engine_overhead_s(model_config, layout, lever, cluster))
    if layout.size > 1:  # this machine: each meeting waits for the slowest rank (jitter.py)
        compute *= 1 + cluster.sync_jitter
    return compute


def _busy_s(layout, cluster, lever, costs) -> tuple[dict, dict, dict, dict]:
    """({dim: busy seconds}, {dim: "network" or "in-node"}, {dim: seconds that lie on the
    critical path whatever the overlap}, {(dim, kind): busy seconds})."""
    busy, links, critical, by_kind = {}, {}, {}, {}
    runner = framework(lever.framework)
    for (dim, kind), (calls, nbytes) in costs.comm.items():
        spans = spans_nodes(layout, dim, cluster.gpus_per_node)
        links[dim] = "network" if spans else "in-node"
        t = _collective_s(cluster, kind, getattr(layout, dim), calls, nbytes, spans,
                          members_per_node(layout, dim, cluster.gpus_per_node))
        busy[dim] = busy.get(dim, 0.0) + t
        by_kind[(dim, kind)] = t
        if kind == "all_to_all" and dim == "dp":  # ep: the tokens wait for their experts
            critical[dim] = critical.get(dim, 0.0) + t
        if (dim, kind) == ("fsdp", "all_gather") and runner.backward_prefetch == "post":
            # torch FSDP1's BACKWARD_POST: each backward all-gather is issued after the
            # previous unit's gradients and waited for; of the (2u-1) gathers per
            # micro-batch, the backward's u-1 lie on the critical path
            units = (calls / lever.micro_batches + 1) / 2
            critical[dim] = critical.get(dim, 0.0) + t * (units - 1) / (2 * units - 1)
    return busy, links, critical, by_kind


def chunks_per_rank(layout: Parallelism, lever: Lever) -> int:
    """Model chunks each pipeline rank holds: the lever's ``virtual_stages``, else the
    layout's (2 under interleaved 1F1B)."""
    return lever.virtual_stages or layout.stages_per_rank


def engine_overhead_s(model_config, layout: Parallelism, lever: Lever,
                      cluster: GPUCluster) -> float:
    """What tp's DTensor dispatch and FSDP2's hooks add to a step: a cost per parameter
    tensor on this rank (per micro-batch), for each engine the layout uses (measured on this
    machine: ``labkit.plan.engines``; no figure on GPUs, so 0 there). The part of the measured
    extra that grows with bytes is not added: bytes are charged by the collectives' and the
    memory's bandwidth already."""
    used = [per_tensor for engine, per_tensor in cluster.engine_overhead_s
            if getattr(layout, engine, 1) > 1]
    if not used:
        return 0.0
    return sum(used) * param_tensors(model_config) * lever.micro_batches / layout.pp


def _ops(model_config, layout: Parallelism, lever: Lever) -> float:
    """Kernel launches per step on a rank (for a fixed per-op cost): one sample's forward and
    backward per micro-batch, and the optimizer's ops once per step, on this rank's share of
    the layers."""
    per_tensor = optimizer_counts(lever.optimizer)[1]
    return (forward_backward_ops(model_config) * lever.micro_batches
            + per_tensor * param_tensors(model_config)) / layout.pp


def sample_ops(model_config, optimizer: str = "adam") -> float:
    """Operators one sample's forward + backward and one optimizer step dispatch."""
    return (forward_backward_ops(model_config)
            + optimizer_counts(optimizer)[1] * param_tensors(model_config))


__all__ = ["ASSUMPTIONS", "Projection", "compute_bytes", "engine_overhead_s", "is_recommender",
           "project", "spans_nodes", "step_costs"]
