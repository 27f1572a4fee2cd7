"""Plots of time: loss curves side by side, step-time breakdowns, speedup against ideal."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator


def plot_losses(reports: dict, title: str = "loss per step", gap: bool = True) -> Figure:
    """Loss curves of several runs (``{label: TrainReport}``) on one axis, and their gap to
    the first one: data parallelism keeps training equal to one device. Runs may have
    different step counts (a torchrun run of 20 steps beside a notebook's 10): the gap is
    drawn over the steps they share. ``gap=False``: the curves alone, for runs that are not
    the same computation (a dense model beside a mixture of experts)."""
    fig = Figure(figsize=(9, 3.4) if gap else (5.5, 3.4), layout="constrained")
    ax, ax_gap = fig.subplots(1, 2) if gap else (fig.subplots(), None)
    reference = np.array(next(iter(reports.values())).losses)
    styles = ["-", "--", ":", "-."]
    for i, (label, report) in enumerate(reports.items()):
        losses = np.array(report.losses)
        (line,) = ax.plot(np.arange(1, len(losses) + 1), losses, styles[i % 4], marker="o",
                          ms=3, label=label, lw=2)
        shared = min(len(losses), len(reference))
        if ax_gap is not None and i and shared:  # each run keeps its colour in both panels
            difference = np.abs(losses[:shared] - reference[:shared])
            ax_gap.plot(np.arange(1, shared + 1), np.maximum(difference, 1e-12), styles[i % 4],
                        marker="o", ms=3, label=label, color=line.get_color())
    for axis in (ax, ax_gap) if ax_gap is not None else (ax,):  # steps are whole numbers
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set(xlabel="step", ylabel="loss", title=title)
    ax.legend(fontsize=8)
    if ax_gap is not None:
        ax_gap.set(xlabel="step", ylabel="|loss - first run's loss|", yscale="log",
                   title="difference: float rounding only")
        ax_gap.axhline(1e-6, color="grey", lw=0.8, ls="--")
        ax_gap.legend(fontsize=8)
    return fig


def _axes(ax, figsize):
    if ax is not None:
        return ax
    return Figure(figsize=figsize, layout="constrained").subplots()


def plot_step_breakdown(scaling, title: str = "", ax=None) -> Figure:
    """Per world size: computation and exposed communication per step (stacked), and the
    communication time the ring AllReduce model predicts. Draws on ``ax`` if given."""
    points = scaling.points
    ax = _axes(ax, (5.5, 3.6))
    x = np.arange(len(points))
    compute = np.array([p.compute_s for p in points]) * 1e3
    comm = np.array([p.comm_s for p in points]) * 1e3
    ax.bar(x, compute, 0.6, color="#4C72B0", label="computation")
    ax.bar(x, comm, 0.6, bottom=compute, color="#DD8452", label="communication (exposed)")
    predicted = [p.predicted_comm_s * 1e3 for p in points]
    ax.plot(x, compute + np.array(predicted), "k_", ms=30, mew=2,
            label="computation + ring model's AllReduce")
    labels = [f"{p.world_size}" + ("*" if p.oversubscribed else "") for p in points]
    ax.set_xticks(x, labels)
    ax.set(xlabel="devices (* = oversubscribed: ranks share cores)", ylabel="ms per step")
    ax.set_title(title or f"{scaling.model} ({scaling.params / 1e6:.2g}M), {scaling.strategy},"
                          f" {scaling.mode} scaling: measured here", fontsize=9)
    ax.set_ylim(0, 1.45 * max(max(compute + comm), max(compute + np.array(predicted))))
    ax.legend(fontsize=7, loc="upper left")
    return ax.figure


def plot_speedup(scaling, ax=None) -> Figure:
    """Measured speedup over one device, the ideal line, and where ranks start sharing cores."""
    worlds = [p.world_size for p in scaling.points]
    ax = _axes(ax, (5, 3.6))
    top = max(worlds)
    ax.plot([1, top], [1, top], color="grey", ls="--", label="ideal (N x)")
    ax.plot(worlds, [scaling.speedup(n) for n in worlds], "o-", color="tab:green",
            label="measured")
    for n in worlds:
        ax.annotate(f"{scaling.speedup(n):.2f}x", (n, scaling.speedup(n)), fontsize=7,
                    textcoords="offset points", xytext=(4, -10))
    if top > scaling.cores:
        ax.axvspan(scaling.cores + 0.5, top + 0.5, color="#F2A0A0", alpha=0.4,
                   label=f"oversubscribed (> {scaling.cores} cores)")
    ax.set(xlabel="devices", ylabel="speedup over 1 device", xticks=worlds,
           xlim=(0.5, top + 0.5), ylim=(0, top + 0.5))
    ax.set_title(f"{scaling.mode} scaling, {scaling.strategy}: measured here", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax.figure


def plot_step_times(reports: dict, title: str = "time per step") -> Figure:
    """Median step time of several runs (``{label: TrainReport}``), split into computation
    and exposed communication."""
    fig = Figure(figsize=(6.5, 3.4), layout="constrained")
    ax = fig.subplots()
    labels = list(reports)
    splits = [reports[k].split() for k in labels]
    compute = np.array([s["compute_s"] for s in splits]) * 1e3
    comm = np.array([s["comm_s"] for s in splits]) * 1e3
    y = np.arange(len(labels))
    ax.barh(y, compute, color="#4C72B0", label="computation")
    ax.barh(y, comm, left=compute, color="#DD8452", label="communication (exposed)")
    for yi, total in zip(y, compute + comm, strict=True):
        ax.text(total, yi, f" {total:.0f} ms", va="center", fontsize=8)
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="ms per step (median, measured here)", title=title)
    ax.margins(x=0.2)
    ax.legend(fontsize=7, loc="lower right")
    return fig
