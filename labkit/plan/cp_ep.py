"""The costs context parallelism (cp) and expert parallelism (ep) add to a step, for the
planner; each rule as labkit's engines run it (``labkit/parallel/context``,
``labkit/parallel/expert``), tested equal to a measured run's bytes.

* cp (ring attention over a cp group): every rank holds 2 of the 2 cp chunks of each sequence,
  so its activations are 1/cp of a replica's; each attention layer passes its keys and values
  round the ring cp-1 times in forward, keys, values and their gradients cp-1 times in
  backward, then the gradients home once (``labkit.runtime.costs.ring_attention_send_bytes``): one
  send per hop, 2(cp-1)+1 per layer. The weights are replicated over cp, so every gradient is
  averaged over cp after backward (one AllReduce per tensor). Beside tp (as Megatron-Core
  runs cp with tp; labkit's own engines train cp with dp and fsdp), each tp rank rings the
  keys and values of its own heads: 1/tp of them, grouped-query attention's kv heads only.
* ep (a mixture of experts' experts cut over the dp ranks, ep = dp): a rank holds
  n_experts / ep experts; each MoE layer runs two all-to-alls forward and two backward of
  its expert buffer (``labkit.runtime.costs.moe_all_to_all_bytes``); the replicated tensors are
  averaged over dp one AllReduce each, the experts' gradients not at all.
"""

from __future__ import annotations

import functools

from labkit.plan.parallelism import Parallelism
from labkit.runtime.costs import moe_all_to_all_bytes, ring_attention_send_bytes


def is_moe(model_config) -> bool:
    return hasattr(model_config, "n_experts") and hasattr(model_config, "capacity")


@functools.lru_cache(maxsize=64)
def parameter_tensors(model_config) -> tuple[int, int, int, int]:
    """(expert parameters, other parameters, expert tensors, other tensors) of the model,
    counted on meta tensors (experts: the ``Experts`` modules' stacked weights)."""
    from labkit.models import build_model

    model = build_model(model_config, device="meta")
    experts = {id(p) for name, m in model.named_modules() if type(m).__name__ == "Experts"
               for p in m.parameters()}
    params = list(model.parameters())
    n_exp = sum(p.numel() for p in params if id(p) in experts)
    n_rest = sum(p.numel() for p in params if id(p) not in experts)
    t_exp = sum(1 for p in params if id(p) in experts)
    return n_exp, n_rest, t_exp, len(params) - t_exp


def ep_local_params(model_config, layout: Parallelism, local: float) -> float:
    """Parameters a rank holds once its experts are 1/ep of them (``local``: before ep)."""
    if layout.ep == 1 or not is_moe(model_config):
        return local
    experts = parameter_tensors(model_config)[0] / layout.pp
    return local - experts * (1 - 1 / layout.ep)


def cp_ep_comm(model_config, layout: Parallelism, micro: int, m: int, grads_per_param: int,
               sharded: float = 1.0, local: float | None = None
               ) -> dict[tuple[str, str], tuple[int, float]]:
    """{(dim, collective): (calls, tensor bytes)} cp and ep add to one rank's step.

    ``micro``: samples per micro-batch on a rank, ``m`` micro-batches; ``sharded``: the share
    of a gradient a rank holds (1 / fsdp under FSDP); ``local``: the parameters a rank holds
    (after tp), None: the whole model's."""
    out: dict[tuple[str, str], tuple[int, float]] = {}
    experts, rest, t_experts, t_rest = parameter_tensors(model_config)
    if layout.cp > 1:
        layers = model_config.n_layers
        seq = model_config.seq_len // layout.cp
        width = model_config.kv_heads * model_config.d_head // layout.tp  # this rank's heads
        nbytes = ring_attention_send_bytes(layers, micro, seq, width, layout.cp)
        out[("cp", "send")] = (m * layers * (2 * (layout.cp - 1) + 1), m * nbytes)
        held = experts + rest if local is None else local
        out[("cp", "all_reduce")] = (t_experts + t_rest, held * grads_per_param * sharded)
    if layout.ep > 1 and is_moe(model_config):
        capacity = model_config.capacity()
        nbytes = moe_all_to_all_bytes(model_config.n_layers, model_config.n_experts, micro,
                                      capacity, model_config.d_model)
        out[("dp", "all_to_all")] = (4 * model_config.n_layers * m, m * nbytes)
        out[("dp", "all_reduce")] = (t_rest, rest * grads_per_param)
    return out


__all__ = ["cp_ep_comm", "ep_local_params", "is_moe", "parameter_tensors"]
