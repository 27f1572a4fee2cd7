"""Plots of notebook 08: the ring's steps, memory per rank by sequence length, the experts'
load per step and the tokens dropped over capacity."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from labkit.parallel.context.sharding import rank_chunks


def plot_ring_schedule(schedule: list[list[dict]]) -> Figure:
    """One panel per step: each rank's query chunks (rows) against the key/value chunks it
    holds then (columns), blocks computed filled (diagonal ones half), skipped ones blank."""
    ranks, steps = len(schedule), len(schedule[0])
    fig = Figure(figsize=(max(6.5, 2.3 * steps + 0.5), 1.3 * ranks + 1.2), layout="constrained")
    axes = np.atleast_2d(fig.subplots(ranks, steps, squeeze=False))
    for rank, rows in enumerate(schedule):
        for entry in rows:
            ax = axes[rank, entry["step"]]
            grid = np.zeros((2, 2))
            for qi, ki, kind in entry["pairs"]:
                grid[qi, ki] = 1.0 if kind == "full" else 0.5
            ax.imshow(grid, cmap="Blues", vmin=0, vmax=1)
            mine, theirs = rank_chunks(rank, ranks), rank_chunks(entry["holds"], ranks)
            ax.set_xticks([0, 1], [f"k{c}" for c in theirs])
            ax.set_yticks([0, 1], [f"q{c}" for c in mine])
            ax.set_title(f"rank {rank}, step {entry['step']}: holds rank {entry['holds']}'s",
                         fontsize=8)
    fig.suptitle("ring attention, causal (measured): q = the rank's query chunks, k = the "
                 "key/value chunks it holds\ndark: whole block; light: diagonal block, masked "
                 "inside; white: skipped (keys after the queries)", fontsize=9)
    return fig


def plot_expert_load(load: list[list[list[int]]], layer: int = 0, capacity: int | None = None,
                     title: str = "") -> Figure:
    """Heat map of the tokens each expert took at each step (``load``: [step][layer][expert],
    summed over ranks); ``capacity``: the most an expert can take per step."""
    matrix = np.array([step[layer] for step in load]).T  # (experts, steps)
    fig = Figure(figsize=(max(4.5, 0.5 * matrix.shape[1] + 2.5), 0.5 * matrix.shape[0] + 1.8),
                 layout="constrained")
    ax = fig.subplots()
    image = ax.imshow(matrix, cmap="viridis", aspect="auto", vmin=0,
                      vmax=capacity or matrix.max())
    for (e, s), value in np.ndenumerate(matrix):
        ax.text(s, e, str(value), ha="center", va="center", fontsize=7, color="white")
    ax.set_xlabel("training step")
    ax.set_ylabel("expert")
    ax.set_yticks(range(matrix.shape[0]))
    ax.set_xticks(range(matrix.shape[1]))
    fig.colorbar(image, ax=ax, label="tokens taken" + (" (max = capacity)" if capacity else ""))
    ax.set_title(title or f"router's choices, MoE layer {layer} (measured)")
    return fig


def plot_dropped(factors: list[float], dropped_share: list[float]) -> Figure:
    """Share of the router's choices dropped over capacity, by capacity factor (measured)."""
    fig = Figure(figsize=(5, 3.2), layout="constrained")
    ax = fig.subplots()
    ax.plot(factors, [100 * d for d in dropped_share], "o-")
    ax.set_xlabel("capacity factor")
    ax.set_ylabel("choices dropped (%)")
    ax.set_title("tokens over capacity skip their expert (measured)")
    ax.grid(alpha=0.3)
    return fig
