"""Plots of device memory: stacked bars by category, the capacity line, the OOM boundary."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from labkit.runtime.memory.oom import CATEGORIES
from labkit.runtime.memory.units import format_bytes

COLORS = {"parameters": "#4C72B0", "gradients": "#DD8452", "optimizer": "#55A868",
          "activations": "#C44E52", "other": "#8C8C8C"}


def _scale(max_bytes: float) -> tuple[float, str]:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if max_bytes >= scale:
            return scale, unit
    return 1, "B"


def plot_memory_bars(bars: list[dict], capacity_bytes: int | None = None,
                     title: str = "memory per device", capacity_label: str = "",
                     ax=None) -> Figure:
    """Stacked bars of bytes by category. Each bar: {"label", "breakdown": {category: bytes},
    "oom": bool (drawn hatched, with the allocation that failed on top), "requested": bytes,
    "estimate": bytes (drawn as a black tick: what the estimator predicted)}. ``ax``: draw
    into this Axes (of a larger Figure) instead of a new Figure."""
    if ax is None:
        fig = Figure(figsize=(max(5.5, 1.4 * len(bars) + 3.5), 3.8), layout="constrained")
        ax = fig.subplots()
    fig = ax.figure
    tops = [sum(b["breakdown"].get(c, 0) for c in CATEGORIES) + b.get("requested", 0)
            for b in bars]
    highest = max(tops + [b.get("estimate", 0) for b in bars] + [capacity_bytes or 0])
    scale, unit = _scale(highest)
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for category in CATEGORIES:
        values = np.array([b["breakdown"].get(category, 0) for b in bars]) / scale
        ax.bar(x, values, 0.6, bottom=bottom, color=COLORS[category], label=category)
        bottom += values
    requested = np.array([b.get("requested", 0) for b in bars]) / scale
    if requested.any():
        ax.bar(x, requested, 0.6, bottom=bottom, color="white", edgecolor="black",
               hatch="//", label="allocation that failed")
    estimates = [(xi, b["estimate"]) for xi, b in zip(x, bars, strict=True) if "estimate" in b]
    if estimates:
        ax.scatter([xi for xi, _ in estimates], [e / scale for _, e in estimates], marker="_",
                   s=900, linewidths=2.5, color="black", zorder=3, label="estimated peak")
    if capacity_bytes:
        label = capacity_label or f"capacity {format_bytes(capacity_bytes)}"
        ax.axhline(capacity_bytes / scale, color="black", linestyle="--", linewidth=1.5,
                   label=label)
    for xi, bar, top in zip(x, bars, tops, strict=True):
        text = "OOM" if bar.get("oom") else format_bytes(top)
        ax.text(xi, top / scale, text, ha="center", va="bottom", fontsize=8,
                color="firebrick" if bar.get("oom") else "black")
    ax.set_xticks(x, [b["label"] for b in bars], fontsize=8)
    ax.set(ylabel=f"bytes ({unit})")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1),
              markerscale=0.4)  # the estimate's tick is a bar wide: a short one in the key
    ax.set_ylim(0, 1.15 * highest / scale)
    return fig


def plot_boundary(boundary, ax=None) -> Figure:
    """Measured fits/OOM per (world size, model size) cell; the predicted boundary drawn over."""
    sizes, worlds = boundary.sizes, boundary.world_sizes
    if ax is None:
        fig = Figure(figsize=(1.6 * len(worlds) + 3, 0.55 * len(sizes) + 2),
                     layout="constrained")
        ax = fig.subplots()
    fig = ax.figure
    for i, world in enumerate(worlds):
        for j, params in enumerate(sizes):
            cell = boundary.cell(params, world)
            ax.add_patch(_cell_patch(i, j, cell.fits))
            text = (f"peak {format_bytes(cell.peak_bytes)}" if cell.fits else
                    f"OOM\nneeds ~{format_bytes(cell.predicted_bytes)}")
            ax.text(i, j, text, ha="center", va="center", fontsize=7)
    # Predicted boundary: above the largest size predicted to fit, per world size.
    edge = []
    for world in worlds:
        fitting = [j for j, p in enumerate(sizes) if boundary.cell(p, world).predicted_fits]
        edge.append(max(fitting, default=-1) + 0.5)
    steps_x = np.repeat(np.arange(len(worlds) + 1) - 0.5, 2)[1:-1]
    ax.plot(steps_x, np.repeat(edge, 2), color="black", linewidth=2.5,
            label="predicted boundary (estimator)")
    ax.set_xticks(range(len(worlds)), [str(w) for w in worlds])
    ax.set_yticks(range(len(sizes)), [f"{p / 1e6:.2g}M" for p in sizes])
    ax.set(xlim=(-0.5, len(worlds) - 0.5), ylim=(-0.5, len(sizes) - 0.5),
           xlabel="devices (world size)", ylabel="model parameters",
           title=f"{boundary.model}, {boundary.strategy}, capacity "
                 f"{format_bytes(boundary.capacity_bytes)}: green fits, red OOM (measured)")
    ax.title.set_fontsize(9)
    if not fig.legends:
        fig.legend(fontsize=7, loc="outside lower center")
    return fig


def _cell_patch(i: int, j: int, fits: bool):
    from matplotlib.patches import Rectangle

    return Rectangle((i - 0.5, j - 0.5), 1, 1, color="#9BD49B" if fits else "#F2A0A0",
                     ec="white", lw=2)


def plot_estimates(estimates: dict, capacity_bytes: int, capacity_label: str = "") -> Figure:
    """Estimated peak per device for named models (``{name: MemoryEstimate}``)."""
    bars = [{"label": name, "breakdown": est.at_peak} for name, est in estimates.items()]
    title = "estimated peak per device\n(projected, not measured: traced on fake tensors)"
    return plot_memory_bars(bars, capacity_bytes, title=title, capacity_label=capacity_label)


def plot_rank_memory(reports: dict, capacity_bytes: int | None = None,
                     title: str = "peak memory per rank, measured") -> Figure:
    """Measured peak by category for every rank of several runs (``{label: TrainReport}``)."""
    bars = [{"label": f"{label}\nrank {rank['rank']}", "breakdown": rank["memory"]["at_peak"]}
            for label, report in reports.items() for rank in report.ranks]
    return plot_memory_bars(bars, capacity_bytes, title=title)
