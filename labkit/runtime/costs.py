"""Every cost formula of the suite, each written once, with its source.

* What one rank sends for a collective, as a share of the tensor it works on (a ring over N
  ranks; Patarasuk and Yuan, 2009; NCCL's "bus bandwidth" uses the same factors): AllReduce
  is a reduce-scatter followed by an all-gather, each passing N-1 pieces of 1/N, so 2(N-1)/N;
  all-gather, reduce-scatter, broadcast and all-to-all pass (N-1)/N once; a point-to-point
  send sends the whole tensor, a receive sends nothing. Each of a ring's steps is one
  message, so the latency alpha is paid per step: 2(N-1) times for AllReduce, N-1 for the
  others (``ring_steps``; Thakur, Rabenseifner and Gropp, 2005).
* What an optimizer keeps per parameter, and what a tensor costs to train (weights, gradient,
  optimizer state).
* The ZeRO paper's model states per device (Rajbhandari et al., 2020, section 3.1).
"""

from __future__ import annotations

# Tensors of a parameter's size that each optimizer keeps (Adam: two moments; SGD without
# momentum: none).
OPTIMIZER_STATE_COPIES = {"adam": 2, "adamw": 2, "sgd": 0}


def ring_share(kind: str, group_size: int) -> float:
    """Bytes one rank sends per byte of the tensor a ``kind`` collective works on."""
    n = max(int(group_size), 1)
    if kind == "all_reduce":
        return 2 * (n - 1) / n
    if kind == "send":
        return 1.0
    if kind == "recv":
        return 0.0
    return (n - 1) / n


def ring_steps(kind: str, group_size: int) -> int:
    """Messages a rank sends one after another in a ``kind`` collective on a ring of N: each
    pays the latency alpha once. AllReduce is a reduce-scatter then an all-gather, N-1 steps
    each (2(N-1)); all-gather, reduce-scatter, broadcast and all-to-all take N-1; a send one."""
    n = max(int(group_size), 1)
    if kind == "all_reduce":
        return 2 * (n - 1)
    if kind == "send":
        return 1
    if kind == "recv":
        return 0
    return n - 1


def collective_seconds(kind: str, nbytes: float, group_size: int, alpha_s: float,
                       bandwidth: float) -> float:
    """Alpha-beta time of a ring collective on a tensor of ``nbytes``: ``alpha_s`` per ring
    step plus what a rank sends over ``bandwidth`` (AllReduce: 2(N-1) alpha + 2(N-1)/N x
    bytes / bandwidth). One rank sends nothing: 0."""
    if ring_steps(kind, group_size) == 0:
        return 0.0
    return (ring_steps(kind, group_size) * alpha_s
            + ring_share(kind, group_size) * nbytes / bandwidth)


def ring_all_reduce_seconds(nbytes: float, world_size: int, bus_bandwidth: float) -> float:
    """Time of a ring AllReduce of ``nbytes`` over ``world_size`` ranks whose links carry
    ``bus_bandwidth`` bytes/s: 2(N-1)/N x bytes / bandwidth."""
    if world_size == 1:
        return 0.0
    return ring_share("all_reduce", world_size) * nbytes / bus_bandwidth


def optimizer_state_bytes(weight_bytes: float, optimizer: str) -> float:
    """The optimizer's state for weights of ``weight_bytes`` (in the weights' own dtype)."""
    return weight_bytes * OPTIMIZER_STATE_COPIES[optimizer]


def training_bytes(weight_bytes: float, optimizer: str) -> float:
    """What a tensor costs while it trains: weights + gradient + optimizer state."""
    return 2 * weight_bytes + optimizer_state_bytes(weight_bytes, optimizer)


# Bytes per parameter of model state: (weights, gradients, optimizer state K), one row per
# recipe, each naming who keeps its state that way. This is the one count of model state in
# labkit: the planner, the memory estimator's analytic check and the plots all read it.
# * "mixed": the ZeRO paper's (Rajbhandari et al. 2020, section 3.1; DeepSpeed's fp16/bf16
#   optimizer): fp16 weights and gradients, and in fp32 a master copy plus Adam's moments
#   (K = 4 + 2 x 4 = 12).
# * "fp32-master": fp32 weights, gradients and moments, bf16 compute (autocast, or FSDP2's
#   param_dtype over fp32 sharded parameters, torch's ZeroRedundancyOptimizer over fp32
#   parameters): labkit's precision="mixed" and torchtitan's; the same bytes as "fp32".
# * "megatron": Megatron's bf16 weights with fp32 main gradients and an fp32 master copy plus
#   moments (Megatron-LM docs/source/api-guide/dist_optimizer.md: 18 bytes per parameter,
#   6 + 12/d with the distributed optimizer over d ranks).
# * "fp32": plain fp32 Adam (K = 2 x 4); "bf16": weights, gradients and moments all bf16 (no
#   master copy): 2 + 2 + 4, labkit's precision="bf16".
# * "fp16-no-master": fairseq's and metaseq's --memory-efficient-fp16: fp16 weights and
#   gradients, Adam's moments in fp32, no fp32 master copy (OPT: "We keep Adam state in FP32
#   ... while the model weights remained in FP16", Zhang et al. 2022, section 2.4): 2 + 2 + 8.
_FP32, _BF16 = 4, 2
_ADAM = OPTIMIZER_STATE_COPIES["adam"]
_STATE_BYTES = {"mixed": (2, 2, _FP32 + _ADAM * _FP32),
                "fp32": (_FP32, _FP32, _ADAM * _FP32),
                "fp32-master": (_FP32, _FP32, _ADAM * _FP32),
                "megatron": (_BF16, _FP32, _FP32 + _ADAM * _FP32),
                "bf16": (_BF16, _BF16, _ADAM * _BF16),
                "fp16-no-master": (_BF16, _BF16, _ADAM * _FP32)}


def model_state_bytes(n_params: float, world_size: int = 1, zero_stage: int = 0,
                      precision: str = "mixed") -> dict[str, float]:
    """Per-device bytes of parameters, gradients and Adam state under ZeRO stage 0-3, for
    the recipe ``precision`` names (a row of ``_STATE_BYTES`` above)."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError("zero_stage is 0 (plain data parallel), 1, 2 or 3")
    if precision not in _STATE_BYTES:
        raise ValueError(f"precision is one of {tuple(_STATE_BYTES)}, not {precision!r}")
    p_bytes, g_bytes, k_bytes = _STATE_BYTES[precision]
    n = world_size
    out = {"parameters": p_bytes * n_params / (n if zero_stage >= 3 else 1),
           "gradients": g_bytes * n_params / (n if zero_stage >= 2 else 1),
           "optimizer": k_bytes * n_params / (n if zero_stage >= 1 else 1)}
    out["total"] = sum(out.values())
    return out


def moe_all_to_all_bytes(n_layers: int, n_experts: int, batch_per_rank: int, capacity: int,
                         d_model: int, bytes_per_element: int = 4) -> int:
    """Tensor bytes of expert parallelism's all-to-alls in one training step, per rank.

    Each MoE layer exchanges its expert buffer (n_experts, batch_per_rank x capacity,
    d_model) four times: dispatch and combine forward, and the same two backward (the
    gradient of an all-to-all is an all-to-all). A rank sends (N-1)/N of it
    (``ring_share("all_to_all", N)``): the block for its own experts stays.
    """
    return 4 * n_layers * n_experts * batch_per_rank * capacity * d_model * bytes_per_element


def ring_attention_send_bytes(n_layers: int, batch: int, seq_per_rank: int, d_model: int,
                              cp: int, bytes_per_element: int = 4) -> int:
    """Bytes one rank sends in one training step of ring attention over ``cp`` ranks.

    Forward passes its keys and values (2 x batch x seq_per_rank x d_model) on cp - 1 times;
    backward passes keys, values and their gradients (4 x that) cp - 1 times, then the
    gradients (2 x) home once more."""
    block = batch * seq_per_rank * d_model * bytes_per_element
    if cp == 1:
        return 0
    return n_layers * (2 * block * (cp - 1) + 4 * block * (cp - 1) + 2 * block)


# Ways to shrink the model state on one device, in bytes per parameter (weights, gradients,
# optimizer state on the device), each with what it costs. Sources: bf16 everywhere (what
# labkit's precision="bf16" runs); 8-bit Adam keeps both moments in 8 bits, block-wise
# quantised (Dettmers et al., 2022, bitsandbytes); ZeRO-Offload keeps the optimizer state in
# host memory and runs Adam on the CPU (Ren et al., 2021).
STATE_ALTERNATIVES = {
    "fp32 weights, gradients, Adam": ((_FP32, _FP32, 2 * _FP32),
                                      "none: the reference"),
    "bf16 weights, gradients, moments": ((_BF16, _BF16, 2 * _BF16),
                                         "updates below bf16's resolution are lost"),
    "8-bit Adam moments": ((_FP32, _FP32, 2 * 1),
                           "quantisation error in the moments; GPU kernels"),
    "optimizer offloaded to the CPU": ((_FP32, _FP32, 0),
                                       "gradients and weights cross PCIe every step; "
                                       "the CPU runs Adam"),
}


def state_alternatives(n_params: float) -> list[dict]:
    """Model-state bytes on the device for ``n_params`` under each of STATE_ALTERNATIVES."""
    return [{"alternative": name, "bytes_per_param": sum(per), "bytes": sum(per) * n_params,
             "cost": cost} for name, (per, cost) in STATE_ALTERNATIVES.items()]
