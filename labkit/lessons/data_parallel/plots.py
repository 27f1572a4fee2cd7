"""Plots of time: loss curves side by side, step-time breakdowns, speedup against ideal, and
the speedup as the batch per rank shrinks."""

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
    ax.legend(fontsize=7, loc="upper left", markerscale=0.4)  # the model's mark is 30 wide
    return ax.figure


def plot_speedup(scaling, ax=None) -> Figure:
    """Measured speedup over one device, the ideal line, and where ranks start sharing cores.
    ``scaling`` is a ``ScalingResult``, or several (strong and weak scaling on one axis, each
    line labelled by its mode)."""
    results = list(scaling) if isinstance(scaling, list | tuple) else [scaling]
    worlds = sorted({p.world_size for result in results for p in result.points})
    ax = _axes(ax, (5, 3.6))
    top, cores = max(worlds), results[0].cores
    ax.plot([1, top], [1, top], color="grey", ls="--", label="ideal (N x)")
    colors = ["tab:green", "tab:purple", "tab:brown"]
    for i, result in enumerate(results):
        mine = [p.world_size for p in result.points]
        label = "measured" if len(results) == 1 else f"{result.mode} scaling, measured"
        ax.plot(mine, [result.speedup(n) for n in mine], "o-", color=colors[i % 3],
                label=label)
        for n in mine if len(results) == 1 else mine[1:]:  # 1 device is 1.00x for each
            others = [r.speedup(n) for r in results if n in [p.world_size for p in r.points]]
            above = result.speedup(n) >= max(others)  # labels of one device count apart
            ax.annotate(f"{result.speedup(n):.2f}x", (n, result.speedup(n)), fontsize=7,
                        color=colors[i % 3], textcoords="offset points",
                        xytext=(5, 4 if above and len(results) > 1 else -11))
    if top > cores:
        ax.axvspan(cores + 0.5, top + 0.5, color="#F2A0A0", alpha=0.4,
                   label=f"oversubscribed (> {cores} cores)")
    ax.set(xlabel="devices", ylabel="speedup over 1 device", xticks=worlds,
           xlim=(0.5, top + 0.5), ylim=(0, top + 0.5))
    modes = " and ".join(dict.fromkeys(result.mode for result in results))
    ax.set_title(f"{modes} scaling, {results[0].strategy}: measured here", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    return ax.figure


def plot_batch_sweep(sweep) -> Figure:
    """A ``BatchSweep``: left, each batch's step on N ranks as a share of one device's step
    (computation, exposed communication, and the model's prediction); right, the speedup
    measured and predicted against the samples each rank computes."""
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    points, n = sweep.points, sweep.world_size
    x = np.arange(len(points))
    compute = np.array([p.many.compute_s / p.one.step_s for p in points])
    comm = np.array([p.many.comm_s / p.one.step_s for p in points])
    left.bar(x, compute, 0.6, color="#4C72B0", label="computation")
    left.bar(x, comm, 0.6, bottom=compute, color="#DD8452", label="communication (exposed)")
    left.plot(x, [p.predicted_step_s / p.one.step_s for p in points], "k_", ms=30, mew=2,
              label="model: F/N + O + ring AllReduce")
    left.axhline(1, color="firebrick", lw=1, label="one device's step")
    left.axhline(1 / n, color="grey", ls="--", lw=1, label=f"ideal: 1/{n}")
    left.set_xticks(x, [f"{p.global_batch}\n({p.samples_per_rank} per rank)" for p in points],
                    fontsize=8)
    left.set(xlabel="global batch", ylabel=f"step on {n} ranks / one device's step",
             ylim=(0, 1.35 * max(1.0, max(compute + comm))))
    left.set_title(f"{sweep.model} ({sweep.params / 1e6:.2g}M), {sweep.strategy} on {n} ranks: "
                   f"where the step goes", fontsize=9)
    left.legend(fontsize=7, loc="upper center", ncols=3, bbox_to_anchor=(0.5, -0.2),
                markerscale=0.4)
    per_rank = [p.samples_per_rank for p in points]
    right.plot(per_rank, [p.speedup for p in points], "o-", color="tab:green", label="measured")
    right.plot(per_rank, [p.predicted_speedup for p in points], "x--", color="black",
               label="model")
    for p in points:
        right.annotate(f"{p.speedup:.2f}x", (p.samples_per_rank, p.speedup), fontsize=7,
                       textcoords="offset points", xytext=(4, -11), color="tab:green")
    right.axhline(n, color="grey", ls="--", lw=1, label=f"ideal ({n}x)")
    right.axhline(1, color="firebrick", lw=1, label="one device")
    top = max(n + 0.5, 1.1 * max(p.speedup for p in points))
    right.set(xscale="log", xlabel="samples per rank (log scale, fewer to the right)",
              ylabel="speedup over 1 device", ylim=(0, top))
    right.set_xticks(per_rank, [str(b) for b in per_rank])
    right.minorticks_off()
    right.set_xlim(max(per_rank) * 1.6, min(per_rank) / 1.6)  # the walk's order, as on the left
    right.set_title("speedup: measured here, and the model's", fontsize=9)
    right.legend(fontsize=7, loc="upper right")
    return fig


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
