"""The OOM boundary map once per memory lever, side by side, the plain boundary drawn on each."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from labkit.runtime.memory.units import format_bytes

FITS, OOM = "#C9E8C9", "#F6CFCF"  # estimated cells: light; trained cells get a mark


def _edge_line(ax, boundary, sizes, worlds, **style) -> None:
    """A step line just above the largest size predicted to fit, per device count."""
    edge = []
    for world in worlds:
        fitting = [j for j, p in enumerate(sizes) if boundary.cell(p, world).predicted_fits]
        edge.append(max(fitting, default=-1) + 0.5)
    steps_x = np.repeat(np.arange(len(worlds) + 1) - 0.5, 2)[1:-1]
    ax.plot(steps_x, np.repeat(edge, 2), **style)


def _panel(ax, boundary, plain, sizes, worlds) -> None:
    for i, world in enumerate(worlds):
        for j, params in enumerate(sizes):
            cell = boundary.cell(params, world)
            ax.add_patch(Rectangle((i - 0.5, j - 0.5), 1, 1, ec="white", lw=2,
                                   color=FITS if cell.predicted_fits else OOM))
            ax.text(i, j, format_bytes(cell.predicted_bytes), ha="center", va="center",
                    fontsize=6.5)
            if cell.measured_fits is not None:  # trained for real: a check or a cross
                ax.text(i + 0.42, j + 0.4, "\u2713" if cell.measured_fits else "\u2717",
                        ha="right", va="top", fontsize=9, fontweight="bold",
                        color="#1B7F1B" if cell.measured_fits else "#B22222")
    if boundary is not plain:
        _edge_line(ax, plain, sizes, worlds, color="grey", linewidth=1.5, linestyle="--",
                   label="plain boundary")
    _edge_line(ax, boundary, sizes, worlds, color="black", linewidth=2.5,
               label="this lever's boundary")
    ax.set_xticks(range(len(worlds)), [str(w) for w in worlds])
    ax.set_yticks(range(len(sizes)), [f"{p / 1e6:.2g}M" for p in sizes])
    ax.set(xlim=(-0.5, len(worlds) - 0.5), ylim=(-0.5, len(sizes) - 0.5), xlabel="devices")
    ax.set_title(boundary.lever, fontsize=9)


def plot_lever_boundaries(maps: list, capacity_bytes: int) -> Figure:
    """One panel per lever (``labkit.lessons.memory_wall.lever_boundary``): each cell's estimated
    peak per device, green if it fits the capacity; a check or cross where a cell was trained."""
    sizes = sorted({c.params for c in maps[0].cells})
    worlds = sorted({c.world_size for c in maps[0].cells})
    fig = Figure(figsize=(max(9.0, (1.1 * len(worlds) + 0.6) * len(maps)),
                          0.5 * len(sizes) + 2.4), layout="constrained")
    axes = fig.subplots(1, len(maps), sharey=True, squeeze=False)[0]
    for ax, boundary in zip(axes, maps, strict=True):
        _panel(ax, boundary, maps[0], sizes, worlds)
    axes[0].set_ylabel("model parameters")
    handles, labels = axes[-1].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=2)
    fig.suptitle(f"estimated peak per device under a {format_bytes(capacity_bytes)} cap, DDP "
                 "(projected: traced on fake tensors); \u2713/\u2717 trained for real here",
                 fontsize=9)
    return fig
