"""The idea of tensor parallelism on a matrix small enough to read: Y = X @ W, split two ways.

* **By columns of W**: rank r holds the r-th block of W's columns and the whole X, and
  computes the r-th block of Y's columns. An all-gather puts the blocks side by side.
* **By rows of W** (the inner dimension): rank r holds the r-th block of W's rows and the
  matching columns of X, and computes a partial Y of full size: its share of the sum over the
  inner dimension. An all-reduce adds the partial results.

``ColumnParallelLinear`` and ``RowParallelLinear`` (``layers.py``) are these two splits with
autograd; a column layer followed by a row layer never needs the all-gather, because the row
layer wants its input split exactly the way the column layer left it.

    demo = split_matmul(cluster)            # runs on every rank of the cluster
    labkit.plots.plot_split_matmul(demo)    # which rank holds what
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class SplitMatmul:
    """The pieces of Y = X @ W that every rank computed, and what the collectives joined.

    Attributes:
        x, w: the inputs, (m, k) and (k, n); y: X @ W computed in one piece, for reference.
        column_blocks: rank r's block of Y's columns, (m, n / N) each.
        column_result: the blocks all-gathered and joined, (m, n), on every rank.
        row_partials: rank r's partial product X[:, block r] @ W[block r, :], (m, n) each.
        row_result: the partial products all-reduced (summed), (m, n), on every rank.
    """

    x: torch.Tensor
    w: torch.Tensor
    y: torch.Tensor
    column_blocks: list[torch.Tensor]
    column_result: torch.Tensor
    row_partials: list[torch.Tensor]
    row_result: torch.Tensor

    @property
    def world_size(self) -> int:
        return len(self.column_blocks)

    def errors(self) -> dict[str, float]:
        """Largest difference between each joined result and the one-piece product."""
        return {"column": (self.column_result - self.y).abs().max().item(),
                "row": (self.row_result - self.y).abs().max().item()}


def _split_on_rank(ctx, x: torch.Tensor, w: torch.Tensor) -> dict:
    """One rank's share of both splits, and the results the collectives joined."""
    n, r = ctx.world_size, ctx.rank
    x, w = x.to(ctx.device), w.to(ctx.device)
    # By columns: the whole X, this rank's columns of W.
    block = x @ w.chunk(n, dim=1)[r]  # (m, n_cols / N)
    blocks = [torch.empty_like(block) for _ in range(n)]
    dist.all_gather(blocks, block, group=ctx.group)
    joined = torch.cat(blocks, dim=1)  # (m, n_cols)
    # By rows: this rank's block of the inner dimension, in X's columns and W's rows.
    partial = x.chunk(n, dim=1)[r] @ w.chunk(n, dim=0)[r]  # (m, n_cols): a share of the sum
    summed = partial.clone()
    dist.all_reduce(summed, group=ctx.group)
    return {"block": block.cpu(), "column": joined.cpu(), "partial": partial.cpu(),
            "row": summed.cpu()}


def split_matmul(cluster, m: int = 3, k: int = 4, n: int = 4, seed: int = 0) -> SplitMatmul:
    """Compute X (m, k) @ W (k, n) split over all ranks of ``cluster`` by columns and by rows.

    Entries are small integers, so every product and sum is exact in float32 and the
    joined results equal the one-piece product bit for bit.
    """
    world_size = cluster.world_size
    for name, size in (("n (the columns of W)", n), ("k (the inner dimension)", k)):
        if size % world_size:
            raise ValueError(f"{name} = {size} does not split over {world_size} ranks: "
                             f"choose a multiple of {world_size}")
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (m, k), generator=generator).float()
    w = torch.randint(-3, 4, (k, n), generator=generator).float()
    ranks = cluster.run(_split_on_rank, x, w)
    for other in ranks[1:]:  # the collectives leave the same result on every rank
        if not (torch.equal(other["column"], ranks[0]["column"])
                and torch.equal(other["row"], ranks[0]["row"])):
            raise RuntimeError("ranks disagree on a joined result: a collective went wrong")
    return SplitMatmul(x, w, x @ w, [r["block"] for r in ranks], ranks[0]["column"],
                       [r["partial"] for r in ranks], ranks[0]["row"])
