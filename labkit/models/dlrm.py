"""A recommendation model in the style of DLRM (Naumov et al., 2019): one embedding table per
sparse feature, a bottom MLP for dense features, pairwise dot-product interaction, a top MLP.
Click data come from a hidden logistic teacher, so loss falls and AUC rises for real."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

import labkit.models.fields as fields


@dataclass(frozen=True)
class DLRMConfig:
    """Parameters ~ num_tables * rows_per_table * embedding_dim: the tables dominate."""

    num_tables: int = 8
    rows_per_table: int = 1000
    embedding_dim: int = 16
    dense_features: int = 13
    bottom_hidden: int = 64
    top_hidden: int = 64

    @property
    def name(self) -> str:
        return "dlrm"

    def __post_init__(self):
        fields.whole(self, "num_tables", "rows_per_table", "embedding_dim", "dense_features",
                     "bottom_hidden", "top_hidden")


def _mlp(d_in: int, d_hidden: int, d_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, d_out))


class DLRM(nn.Module):
    def __init__(self, config: DLRMConfig):
        super().__init__()
        self.tables = nn.ModuleList(nn.Embedding(config.rows_per_table, config.embedding_dim)
                                    for _ in range(config.num_tables))
        self.bottom = _mlp(config.dense_features, config.bottom_hidden, config.embedding_dim)
        n_vectors = config.num_tables + 1
        n_pairs = n_vectors * (n_vectors - 1) // 2
        self.top = _mlp(config.embedding_dim + n_pairs, config.top_hidden, 1)

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        dense, sparse = inputs  # (batch, dense_features), (batch, num_tables) row ids
        vectors = [self.bottom(dense)] + [table(sparse[:, i]) for i, table in
                                          enumerate(self.tables)]
        stacked = torch.stack(vectors, dim=1)  # (batch, n_vectors, embedding_dim)
        dots = stacked @ stacked.transpose(1, 2)  # (batch, n_vectors, n_vectors)
        i, j = torch.triu_indices(len(vectors), len(vectors), offset=1, device=dots.device)
        features = torch.cat([vectors[0], dots[:, i, j]], dim=1)
        return self.top(features).sum(1)  # (batch,) click logits (a sum over one column: a
        # new tensor, not a view, as FSDP2 asks of a root output)

    @staticmethod
    def loss(logits: torch.Tensor, clicks: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits, clicks)


def dlrm_batch(config: DLRMConfig, step: int, batch_size: int, seed: int = 0):
    """Dense features ~ N(0,1), row ids uniform; clicks ~ Bernoulli(sigmoid(teacher score))."""
    teacher = torch.Generator().manual_seed(30_000 + seed)
    row_effect = 1.5 * torch.randn(config.num_tables, config.rows_per_table, generator=teacher)
    dense_weight = torch.randn(config.dense_features, generator=teacher) / 2
    data = torch.Generator().manual_seed(seed * 1_000_003 + step)
    dense = torch.randn(batch_size, config.dense_features, generator=data)
    sparse = torch.randint(config.rows_per_table, (batch_size, config.num_tables), generator=data)
    score = dense @ dense_weight + row_effect.gather(1, sparse.T).sum(0) / config.num_tables**0.5
    clicks = torch.bernoulli(torch.sigmoid(score), generator=data)
    return (dense, sparse), clicks  # ((batch, dense), (batch, tables)), (batch,)
