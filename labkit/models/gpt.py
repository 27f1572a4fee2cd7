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
    """Parameters ~ 12 * n_layers * d_model**2 + 2 * vocab_size * d_model (untied head)."""

    vocab_size: int = 256
    seq_len: int = 64
    d_model: int = 128
    n_heads: int = 4
    n_layers: int = 2

    @property
    def name(self) -> str:
        return "gpt"

    def __post_init__(self):
        fields.whole(self, "vocab_size", "seq_len", "d_model", "n_heads", "n_layers")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by "
                             f"n_heads ({self.n_heads})")


def causal_attention(q, k, v):
    """Causal attention over the whole sequence; (batch, head, seq, d_head) each."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class SelfAttention(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.d_head = config.d_model // config.n_heads
        # Same arguments, same result: context parallelism puts ring attention here.
        self.attention = causal_attention
        self.qkv = nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        # Sizes come from the tensors, not the config: under tensor parallelism a rank holds
        # only some heads (the local qkv output is 3 x heads_here x d_head wide).
        q, k, v = self.qkv(x).chunk(3, dim=2)  # each (batch, seq, heads x d_head)
        heads = (batch, seq, q.shape[-1] // self.d_head, self.d_head)
        q, k, v = (t.view(heads).transpose(1, 2) for t in (q, k, v))  # (batch, head, seq, d_head)
        y = self.attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, -1))


class Block(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(config.d_model)
        self.attn = SelfAttention(config)
        self.norm2 = nn.LayerNorm(config.d_model)
        self.mlp = nn.Sequential(nn.Linear(config.d_model, 4 * config.d_model), nn.GELU(),
                                 nn.Linear(4 * config.d_model, config.d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(config.vocab_size, config.d_model)
        self.pos = nn.Embedding(config.seq_len, config.d_model)
        self.blocks = nn.Sequential(*[Block(config) for _ in range(config.n_layers)])
        self.norm = nn.LayerNorm(config.d_model)
        self.head = nn.Linear(config.d_model, config.vocab_size, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)  # (batch, seq, d_model)
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
