"""A GPT-style decoder (pre-norm blocks: causal self-attention + MLP), in the manner of
minGPT/nanoGPT, and next-token data from a hidden Markov chain that the model can learn."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import labkit.models.fields as fields


@dataclass(frozen=True)
class GPTConfig:
    """A decoder's shape and its block's kind. The defaults are a GPT-2-style block (LayerNorm,
    learned positions, a 4x GELU MLP, biases, an untied head): parameters ~ 12 * n_layers *
    d_model**2 + 2 * vocab_size * d_model. A Llama-style block (Touvron et al. 2023; Llama 3:
    Dubey et al. 2024) sets ``mlp="swiglu"`` with its ``d_ff``, ``n_kv_heads`` below
    ``n_heads`` (grouped-query attention, Ainslie et al. 2023), ``norm="rmsnorm"``,
    ``position="rope"`` (rotary embeddings, Su et al. 2021, base ``rope_theta``) and
    ``bias=False``; ``tie_embeddings`` makes the head the token embedding's transpose
    (``labkit.models.presets`` holds published shapes)."""

    vocab_size: int = 256
    seq_len: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2
    mlp: str = "gelu"  # "gelu": Linear, GELU, Linear; "swiglu": down(silu(gate(x)) * up(x))
    d_ff: int | None = None  # the MLP's hidden width; None: 4 x d_model
    n_kv_heads: int | None = None  # key/value heads; None: n_heads (multi-head attention)
    norm: str = "layernorm"  # or "rmsnorm"
    position: str = "learned"  # a learned position embedding, or "rope"
    rope_theta: float = 10_000.0
    bias: bool = True  # biases on the linears (and LayerNorm)
    tie_embeddings: bool = False

    @property
    def name(self) -> str:
        return "gpt"

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads or self.n_heads

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    @property
    def ff_width(self) -> int:
        return self.d_ff or 4 * self.d_model

    def __post_init__(self):
        fields.whole(self, "vocab_size", "seq_len", "d_model", "n_heads", "n_layers")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by "
                             f"n_heads ({self.n_heads})")
        fields.one_of(self, "mlp", ("gelu", "swiglu"))
        fields.one_of(self, "norm", ("layernorm", "rmsnorm"))
        fields.one_of(self, "position", ("learned", "rope"))
        fields.positive(self, "rope_theta")
        fields.flag(self, "bias", "tie_embeddings")
        if self.d_ff is not None:
            fields.whole(self, "d_ff")
        if self.n_kv_heads is not None:
            fields.whole(self, "n_kv_heads")
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_kv_heads ({self.n_kv_heads}) must divide n_heads "
                                 f"({self.n_heads}): each key/value head serves a group of "
                                 "query heads")
        if self.position == "rope" and self.d_head % 2:
            raise ValueError(f"rotary embeddings turn pairs of dimensions: d_head "
                             f"({self.d_head}) must be even")


def causal_attention(q, k, v):
    """Causal attention over the whole sequence; q (batch, head, seq, d_head), k and v
    (batch, kv_head, seq, d_head): fewer key/value heads than query heads is grouped-query
    attention (query head i reads key/value head i // (heads / kv_heads))."""
    if k.shape[1] != q.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary position embedding (RoFormer, Su et al. 2021) of x (batch, head, seq, d_head):
    dimension pair (i, i + d_head/2) of position p turns by p / theta**(2i / d_head)."""
    seq, d_head = x.shape[-2], x.shape[-1]
    steps = torch.arange(0, d_head, 2, device=x.device, dtype=torch.float32) / d_head
    angles = torch.outer(torch.arange(seq, device=x.device, dtype=torch.float32),
                         theta ** -steps)  # (seq, d_head / 2)
    cos, sin = (t.repeat(1, 2).to(x.dtype) for t in (angles.cos(), angles.sin()))
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.d_head = config.d_head
        self.group = config.n_heads // config.kv_heads  # query heads per key/value head
        self.rope_theta = config.rope_theta if config.position == "rope" else None
        # Same arguments, same result: context parallelism puts ring attention here.
        self.attention = causal_attention
        width = (config.n_heads + 2 * config.kv_heads) * config.d_head
        self.qkv = nn.Linear(config.d_model, width, bias=config.bias)
        self.proj = nn.Linear(config.d_model, config.d_model, bias=config.bias)

    def _split(self, qkv: torch.Tensor):
        """q (batch, seq, heads x d_head), k and v (batch, seq, kv_heads x d_head). Sizes come
        from the tensor, not the config: under tensor parallelism a rank holds only some
        heads. Multi-head attention's rows are [q; k; v]; grouped-query attention's are one
        group after another, [q heads of the group; its k; its v] (Megatron-Core's layout),
        so an even split by rows gives a tp rank whole groups."""
        if self.group == 1:
            return qkv.chunk(3, dim=2)
        batch, seq, width = qkv.shape
        groups = qkv.view(batch, seq, -1, self.group + 2, self.d_head)
        q = groups[..., :self.group, :].reshape(batch, seq, -1)
        return q, groups[..., self.group, :].flatten(2), groups[..., self.group + 1, :].flatten(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self._split(self.qkv(x))
        q, k, v = (t.view(batch, seq, -1, self.d_head).transpose(1, 2)
                   for t in (q, k, v))  # (batch, head, seq, d_head)
        if self.rope_theta is not None:
            q, k = rotary(q, self.rope_theta), rotary(k, self.rope_theta)
        y = self.attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, -1))


class SwiGLU(nn.Module):
    """The gated MLP of PaLM and Llama (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        d, hidden = config.d_model, config.ff_width
        self.gate = nn.Linear(d, hidden, bias=config.bias)
        self.up = nn.Linear(d, hidden, bias=config.bias)
        self.down = nn.Linear(hidden, d, bias=config.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


def make_norm(config: GPTConfig) -> nn.Module:
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.d_model, eps=1e-5)
    return nn.LayerNorm(config.d_model, bias=config.bias)


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = make_norm(config)
        self.attn = SelfAttention(config)
        self.norm2 = make_norm(config)
        if config.mlp == "swiglu":
            self.mlp = SwiGLU(config)
        else:
            d, hidden, bias = config.d_model, config.ff_width, config.bias
            self.mlp = nn.Sequential(nn.Linear(d, hidden, bias=bias), nn.GELU(),
                                     nn.Linear(hidden, d, bias=bias))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TiedHead(nn.Module):
    """The head of tied embeddings: logits = x @ tok.weight^T. The embedding is held outside
    the module tree, so the weight is one parameter (``tok.weight``) to every engine."""

    def __init__(self, embedding: nn.Embedding):
        super().__init__()
        object.__setattr__(self, "_embedding", embedding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self._embedding.weight)


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = (nn.Embedding(config.seq_len, config.d_model)
                    if config.position == "learned" else None)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layers)])
        self.norm = make_norm(config)
        self.head = (TiedHead(self.tok) if config.tie_embeddings
                     else nn.Linear(config.d_model, config.vocab_size, bias=False))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)  # (batch, seq, d_model)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        return self.head(self.norm(self.blocks(x)))  # (batch, seq, vocab)

    @staticmethod
    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def gpt_batch(config: GPTConfig, step: int, batch_size: int, seed: int = 0):
    """Token sequences from a fixed random Markov chain whose next token is fairly predictable."""
    teacher = torch.Generator().manual_seed(20_000 + seed)
    logits = 3.0 * torch.randn(config.vocab_size, config.vocab_size, generator=teacher)
    transition = torch.softmax(logits, dim=1)  # (vocab, vocab): a peaked next-token law
    data = torch.Generator().manual_seed(seed * 1_000_003 + step)
    tokens = torch.empty(batch_size, config.seq_len + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(config.vocab_size, (batch_size,), generator=data)
    for t in range(config.seq_len):
        tokens[:, t + 1] = torch.multinomial(transition[tokens[:, t]], 1, generator=data)[:, 0]
    return tokens[:, :-1], tokens[:, 1:]  # (batch, seq) inputs and next-token targets
