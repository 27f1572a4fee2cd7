"""The zoo's DLRM with its tables placed by a ``TablePlan`` over a group of ranks (the run's
fsdp dimension); the dense part on every rank.

Each rank trains on its slice of the global batch (data parallel, like DDP) and holds:

* the bottom and top MLPs, whole (they are small; their gradients are averaged);
* its whole tables (table-wise): it looks them up for the whole group's batch, then one
  all-to-all sends every rank of the group the rows of its own samples
  (``comm.exchange_lookups``);
* a slice of the rows of every row-wise table (a ``Shard(0)`` DTensor, looked up by
  ``row_sharded.py``; or DTensor's ``RowwiseParallel`` with the "dtensor" engine): each rank
  looks up the ids that fall in its rows (zeros elsewhere), and a reduce-scatter sums the
  partial rows and hands every rank those of its own samples.

Parameter names are the plain DLRM's (``tables.3.weight``), so ranks' weights merge into a
state dict that ``DLRM.load_state_dict`` takes. Groups that hold the same tables are
replicas of each other (a hybrid layout: tables sharded in a group, replicated across groups).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from labkit.models import DLRM
from labkit.parallel.embedding.comm import exchange_lookups, gather_ids
from labkit.parallel.embedding.placement import TablePlan


def interact(bottom_out: torch.Tensor, table_vectors: list[torch.Tensor],
             top: nn.Module) -> torch.Tensor:
    """DLRM's pairwise dot-product interaction and top MLP, exactly as ``DLRM.forward``."""
    vectors = [bottom_out, *table_vectors]
    stacked = torch.stack(vectors, dim=1)  # (batch, n_vectors, embedding_dim)
    dots = stacked @ stacked.transpose(1, 2)  # (batch, n_vectors, n_vectors)
    i, j = torch.triu_indices(len(vectors), len(vectors), offset=1, device=dots.device)
    features = torch.cat([bottom_out, dots[:, i, j]], dim=1)
    return top(features).sum(1)  # (batch,) click logits


class ShardedDLRM(nn.Module):
    """This rank's part of a DLRM under ``plan`` over ``group`` (its rank there: the one whose
    tables it holds); built from a DLRM on the meta device."""

    def __init__(self, dlrm: DLRM, plan: TablePlan, group):
        super().__init__()
        self.group, self.rank = group, dist.get_rank(group)
        self.plan, self.world_size = plan, plan.world_size
        held = sorted(plan.tables_per_rank[self.rank] + plan.row_wise)
        self.tables = nn.ModuleDict({str(t): dlrm.tables[t] for t in held})
        self.bottom, self.top = dlrm.bottom, dlrm.top
        self.num_tables = len(dlrm.tables)
        self.embedding_dim = dlrm.tables[0].embedding_dim

    def dense_modules(self) -> nn.ModuleList:
        """The data-parallel part: weights whole on every rank, gradients averaged."""
        return nn.ModuleList([self.bottom, self.top])

    def _whole_tables(self, ids: torch.Tensor, batch: int) -> dict[int, torch.Tensor]:
        """Look up this rank's whole tables for every rank's samples, exchange the rows."""
        per_rank = self.plan.tables_per_rank
        if not any(per_rank):
            return {}
        own, dim = per_rank[self.rank], self.embedding_dim
        if own:  # (group's batch, own tables, dim): rows in rank order of their samples
            looked_up = torch.stack([self.tables[str(t)](ids[:, t]) for t in own], dim=1)
        else:  # nothing to send, but backward's exchange must run here too, or peers wait
            looked_up = self.bottom[0].weight.new_zeros((ids.shape[0], 0, dim),
                                                        requires_grad=torch.is_grad_enabled())
        send = [batch * len(own) * dim] * self.world_size
        receive = [batch * len(tables) * dim for tables in per_rank]
        received = exchange_lookups(looked_up.reshape(-1), send, receive, self.group)
        vectors = {}
        for tables, piece in zip(per_rank, received.split(receive), strict=True):
            piece = piece.view(batch, len(tables), dim)  # (batch, that rank's tables, dim)
            vectors.update({t: piece[:, k] for k, t in enumerate(tables)})
        return vectors

    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        dense, sparse = inputs  # (batch, dense_features), (batch, num_tables): this rank's
        ids = gather_ids(sparse, self.group)  # (group's batch, num_tables)
        vectors = self._whole_tables(ids, sparse.shape[0])
        for t in self.plan.row_wise:  # reduce-scatter inside: (batch, dim), own samples
            vectors[t] = self.tables[str(t)](ids[:, t])
        return interact(self.bottom(dense), [vectors[t] for t in range(self.num_tables)],
                        self.top)

    def parameter_groups(self) -> dict[str, list[nn.Parameter]]:
        """Parameters by part: {"tables": [...], "dense": [...]}."""
        return {"tables": list(self.tables.parameters()),
                "dense": list(self.dense_modules().parameters())}
