"""A GPT whose MLPs are mixtures of experts: each token is sent to its top-k of n experts
(Shazeer et al. 2017; GShard, Lepikhin et al. 2020; Switch, Fedus et al. 2021).

Routing, per MoE layer, for x (batch, seq, d_model):
* the router scores every expert, softmax -> probs (batch, seq, n_experts); each token picks
  its top_k experts, weights renormalised to sum to 1 when top_k > 1 (GShard); with top_k = 1
  the weight is the chosen expert's probability itself (Switch): renormalised it would be 1
  and the router would get no gradient from the language-model loss;
* capacity: an expert takes at most C = min(ceil(capacity_factor x seq x top_k / n_experts),
  seq) tokens of each sequence (GShard's groups, one per sequence: what a sequence drops does not
  depend on how the batch is split over ranks); all first choices are served before second
  choices, in token order; a token over capacity skips that expert (its residual carries it);
* the load-balancing loss (Switch's): n_experts x sum_e f_e x P_e per sequence (f_e: share of
  the sequence's choices for e, P_e: mean router probability of e), averaged, weighted by
  ``aux_loss_weight``, added to the gradient only (the recorded loss is the language model's).

The experts' inputs sit in one buffer (n_experts, tokens' slots, d_model); ``self.exchange``
runs the experts on it: locally here, through two all-to-alls under expert parallelism
(``labkit/parallel/expert``). Parameters grow with n_experts; FLOPs per token with top_k.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import labkit.models.fields as fields
from labkit.models.gpt import GPT, GPTConfig


@dataclass(frozen=True)
class MoEGPTConfig(GPTConfig):
    """A GPT with n_experts MLPs per block, top_k of them per token."""

    n_experts: int = 4
    top_k: int = 2
    capacity_factor: float = 1.25
    aux_loss_weight: float = 0.01

    @property
    def name(self) -> str:
        return "moe_gpt"

    def __post_init__(self):
        super().__post_init__()
        fields.whole(self, "n_experts", "top_k")
        fields.positive(self, "capacity_factor")
        fields.positive(self, "aux_loss_weight", allow_zero=True)
        if self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) cannot exceed n_experts ({self.n_experts})")

    def capacity(self) -> int:
        """Slots per expert per sequence, at most seq_len: a token picks an expert once, so
        more slots would stay empty (a factor of 1e7 asked the ranks for 80 GB of them)."""
        slots = math.ceil(self.capacity_factor * self.seq_len * self.top_k / self.n_experts)
        return min(slots, self.seq_len)


class Experts(nn.Module):
    """n_experts two-layer MLPs (d_model -> 4 d_model -> d_model) stacked on dim 0, run as
    batched matmuls on (experts, tokens, d_model). Under expert parallelism the weights are
    DTensors sharded on dim 0: a rank runs its own experts."""

    def __init__(self, n_experts: int, d_model: int):
        super().__init__()
        hidden, bound1, bound2 = 4 * d_model, d_model ** -0.5, (4 * d_model) ** -0.5
        self.w1 = nn.Parameter(torch.empty(n_experts, d_model, hidden).uniform_(-bound1, bound1))
        self.b1 = nn.Parameter(torch.empty(n_experts, hidden).uniform_(-bound1, bound1))
        self.w2 = nn.Parameter(torch.empty(n_experts, hidden, d_model).uniform_(-bound2, bound2))
        self.b2 = nn.Parameter(torch.empty(n_experts, d_model).uniform_(-bound2, bound2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w1, b1, w2, b2 = (_local(p) for p in (self.w1, self.b1, self.w2, self.b2))
        h = F.gelu(torch.bmm(x, w1) + b1.unsqueeze(1))  # (experts here, tokens, 4 d_model)
        return torch.bmm(h, w2) + b2.unsqueeze(1)


def _local(p: torch.Tensor) -> torch.Tensor:
    return p.to_local() if hasattr(p, "to_local") else p


def run_local(experts: Experts, buffer: torch.Tensor) -> torch.Tensor:
    """Every expert on this rank: (n_experts, slots, d_model) -> the same shape."""
    return experts(buffer)


class _AttachAux(torch.autograd.Function):
    """Identity on x forward; backward also gives the auxiliary loss its gradient (its
    weight), so that it trains the router without entering the recorded loss (Megatron-LM's
    MoEAuxLossAutoScaler does the same)."""

    @staticmethod
    def forward(ctx, x, aux, weight):
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad, torch.full((), ctx.weight, dtype=grad.dtype, device=grad.device), None


def route(probs: torch.Tensor, top_k: int, capacity: int):
    """(weight, expert, slot, kept), each (batch, seq, top_k): the chosen experts, their
    weights, the slot each choice takes in its expert's buffer, and whether it fits."""
    batch, seq, n_experts = probs.shape
    weight, expert = probs.topk(top_k, dim=-1)
    if top_k > 1:  # top-1 keeps its probability: 1.0 would cut the router off the loss
        weight = weight / weight.sum(-1, keepdim=True)
    order = expert.transpose(1, 2).reshape(batch, top_k * seq)  # first choices first
    onehot = F.one_hot(order, n_experts)  # (batch, top_k x seq, n_experts)
    slot = ((onehot.cumsum(1) - 1) * onehot).sum(-1).view(batch, top_k, seq).transpose(1, 2)
    return weight, expert, slot, slot < capacity


def balance_loss(probs: torch.Tensor, expert: torch.Tensor) -> torch.Tensor:
    """Switch's load-balancing loss, per sequence then averaged: n x sum_e f_e P_e."""
    n_experts = probs.shape[-1]
    chosen = F.one_hot(expert, n_experts).float().sum(2)  # (batch, seq, n_experts)
    share = chosen.mean(1) / expert.shape[-1]  # (batch, n_experts): f_e
    return (n_experts * (share * probs.mean(1)).sum(-1)).mean()


class MoE(nn.Module):
    def __init__(self, config: MoEGPTConfig):
        super().__init__()
        self.config = config
        self.router = nn.Linear(config.d_model, config.n_experts, bias=False)
        self.experts = Experts(config.n_experts, config.d_model)
        self.exchange = run_local  # expert parallelism puts its all-to-all here
        self.stats: dict[str, torch.Tensor] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        config, (batch, seq, d_model) = self.config, x.shape
        probs = torch.softmax(self.router(x).float(), dim=-1)  # (batch, seq, n_experts)
        weight, expert, slot, kept = route(probs, config.top_k, config.capacity())
        slots = batch * config.capacity()  # per expert, on this rank
        rows = torch.arange(batch, device=x.device).view(batch, 1, 1).expand_as(expert)
        tokens = rows * seq + torch.arange(seq, device=x.device).view(1, seq, 1)
        where = expert * slots + rows * config.capacity() + slot  # row in the flat buffer
        # Shapes that do not depend on the routing (the estimator traces them on fake
        # tensors): a dropped choice adds zeros to row 0 and takes back nothing.
        where = where.masked_fill(~kept, 0).flatten()  # (batch x seq x top_k,)
        keep = kept.flatten().unsqueeze(-1).to(x.dtype)
        weight = weight.flatten().unsqueeze(-1).to(x.dtype) * keep
        flat = x.reshape(batch * seq, d_model)
        sources = flat[tokens.flatten()] * keep  # (batch x seq x top_k, d_model)
        buffer = flat.new_zeros(config.n_experts * slots, d_model).index_add(0, where, sources)
        out = self.exchange(self.experts, buffer.view(config.n_experts, slots, d_model))
        picked = out.reshape(-1, d_model)[where] * weight
        y = flat.new_zeros(batch * seq, d_model).index_add(0, tokens.flatten(), picked)
        load = (F.one_hot(expert, config.n_experts) * kept.unsqueeze(-1)).sum((0, 1, 2))
        over = (F.one_hot(expert, config.n_experts) * (~kept).unsqueeze(-1)).sum((0, 1, 2))
        self.stats = {"load": load.detach(), "dropped": (~kept).sum().detach(),
                      "dropped_by_expert": over.detach()}  # (n_experts,) choices over capacity
        if self.training and config.aux_loss_weight and torch.is_grad_enabled():
            y = _AttachAux.apply(y, balance_loss(probs, expert), config.aux_loss_weight)
        return y.view(batch, seq, d_model)


class MoEGPT(GPT):
    """The zoo's GPT with each block's MLP a mixture of experts."""

    def __init__(self, config: MoEGPTConfig):
        super().__init__(config)
        for block in self.blocks:
            block.mlp = MoE(config)

    def moe_layers(self) -> list[MoE]:
        return [m for m in self.modules() if isinstance(m, MoE)]
