"""Plots of sharded recommenders: memory per rank by part, the planner's placement, training
quality (loss and held-out AUC), and where a step's time goes."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from labkit.lessons.memory_wall.plots import _scale, plot_memory_bars
from labkit.parallel.embedding.results import auc_curve, memory_by_part, time_split
from labkit.runtime.memory.units import format_bytes

PART_COLORS = {"tables": "#4C72B0", "dense": "#55A868", "rest": "#C8C8C8"}
PART_LABELS = {"tables": "tables (weights + gradients + optimizer)",
               "dense": "dense MLPs (weights + gradients + optimizer)",
               "rest": "rest of the measured peak (optimizer temporaries, activations)"}
TIME_COLORS = {"lookup_s": "#4C72B0", "comm_s": "#DD8452", "optimizer_s": "#8172B3",
               "dense_s": "#55A868"}
TIME_LABELS = {"lookup_s": "table lookups", "comm_s": "communication (exposed)",
               "optimizer_s": "optimizer step (every row of every table)",
               "dense_s": "dense MLPs, interaction"}


def _capacity_line(ax, capacity_bytes, scale, vertical=False) -> None:
    if capacity_bytes:
        line = ax.axvline if vertical else ax.axhline
        line(capacity_bytes / scale, color="black", ls="--", lw=1.5,
             label=f"capacity {format_bytes(capacity_bytes)}")


def plot_table_memory(reports: dict, capacity_bytes: int | None = None,
                      title: str = "memory per rank, measured") -> Figure:
    """Stacked bars for every rank of sharded runs (``{label: TrainReport}``): tables, dense
    part, and the rest of the rank's measured peak."""

    bars = [(f"{label}\nrank {part['rank']}", part) for label, report in reports.items()
            for part in memory_by_part(report)]
    fig = Figure(figsize=(max(6, 0.9 * len(bars) + 4), 3.8), layout="constrained")
    ax = fig.subplots()
    scale, unit = _scale(max([p["peak"] for _, p in bars] + [capacity_bytes or 0]))
    x, bottom = np.arange(len(bars)), np.zeros(len(bars))
    for part in PART_COLORS:
        values = np.array([p[part] for _, p in bars]) / scale
        ax.bar(x, values, 0.6, bottom=bottom, color=PART_COLORS[part], label=PART_LABELS[part])
        bottom += values
    _capacity_line(ax, capacity_bytes, scale)
    ax.set_xticks(x, [label for label, _ in bars], fontsize=8)
    ax.set(ylabel=f"bytes ({unit})")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def plot_plan(plan, title: str = "") -> Figure:
    """The planner's placement: per rank, its whole tables, its row-wise shares (hatched) and
    the reserve for the dense part, against the capacity."""
    fig = Figure(figsize=(8, 0.6 * plan.world_size + 1.8), layout="constrained")
    ax = fig.subplots()
    scale, unit = _scale(max(plan.total_bytes + [plan.capacity_bytes or 0]))
    colors = [f"C{i % 10}" for i in range(len(plan.table_bytes))]
    share = dict(zip(plan.row_wise, plan.row_wise_share, strict=True))
    for rank, tables in enumerate(plan.tables_per_rank):
        left = plan.reserved_bytes / scale
        ax.barh(rank, left, color="#C8C8C8", label="reserve: dense part, lookups" if rank == 0
                else None)
        pieces = [(t, plan.table_bytes[t], "") for t in tables]
        pieces += [(t, share[t], "//") for t in plan.row_wise]
        for table, nbytes, hatch in pieces:
            width = nbytes / scale
            ax.barh(rank, width, left=left, color=colors[table], edgecolor="white", hatch=hatch)
            ax.text(left + width / 2, rank, f"t{table}" + ("/N" if hatch else ""),
                    ha="center", va="center", fontsize=7, color="white")
            left += width
    _capacity_line(ax, plan.capacity_bytes, scale, vertical=True)
    ax.set_yticks(range(plan.world_size), [f"rank {r}" for r in range(plan.world_size)])
    ax.invert_yaxis()
    ax.set(xlabel=f"planned bytes ({unit}): weights + gradients + optimizer state")
    ax.set_title(title or f"placement ({plan.method}); hatched: rows split over all ranks",
                 fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def plot_training(reports: dict) -> Figure:
    """Loss per step and held-out AUC (before training, then after every step) of sharded
    runs (``{label: TrainReport}``)."""

    fig = Figure(figsize=(10, 3.4), layout="constrained")
    ax_loss, ax_auc = fig.subplots(1, 2)
    for i, (label, report) in enumerate(reports.items()):
        steps = np.arange(1, report.steps + 1)
        before, after = auc_curve(report)
        style = ["-", "--", ":", "-."][i % 4]
        ax_loss.plot(steps, report.losses, style, marker="o", ms=2, label=label)
        ax_auc.plot(np.arange(0, report.steps + 1), [before, *after], style, marker="o",
                    ms=2, label=label)
    ax_loss.set(xlabel="step", ylabel="training loss (global batch)", title="loss")
    ax_auc.axhline(0.5, color="grey", lw=0.8, ls="--", label="guessing")
    ax_auc.set(xlabel="step (0: before training)", ylabel="AUC",
               title="held-out AUC (samples never trained on)")
    for ax in (ax_loss, ax_auc):
        ax.legend(fontsize=8)
    return fig


def plot_step_split(reports: dict, epoch_samples: int, where: str = "measured here") -> Figure:
    """Left: a median step split into lookups, communication and the rest (a run without the
    split, e.g. one device, is one grey bar). Right: seconds per epoch of ``epoch_samples``."""

    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_step, ax_epoch = fig.subplots(1, 2)
    labels = list(reports)
    x = np.arange(len(labels))
    bottom = np.zeros(len(labels))
    for i, report in enumerate(reports.values()):
        if "lookup_s" not in report.ranks[0]["records"][-1]:
            ax_step.bar(i, report.median_step_s * 1e3, 0.6, color="#8C8C8C",
                        label="whole step (not split)")
            continue
        split = time_split(report)
        for key, color in TIME_COLORS.items():
            ax_step.bar(i, split[key] * 1e3, 0.6, bottom=bottom[i], color=color,
                        label=TIME_LABELS[key] if i == len(labels) - 1 else None)
            bottom[i] += split[key] * 1e3
    ax_step.set_xticks(x, labels, fontsize=8)
    ax_step.set(ylabel="ms per step (median)", title="where a step's time goes")
    handles, names = ax_step.get_legend_handles_labels()
    unique = dict(zip(names, handles, strict=True))
    ax_step.legend(unique.values(), unique.keys(), fontsize=7)
    epoch = [epoch_samples / report.samples_per_s for report in reports.values()]
    ax_epoch.bar(x, epoch, 0.6, color="#4C72B0")
    for xi, seconds in zip(x, epoch, strict=True):
        ax_epoch.text(xi, seconds, f"{seconds:.0f} s", ha="center", va="bottom", fontsize=8)
    ax_epoch.set_xticks(x, labels, fontsize=8)
    oversubscribed = any(r.oversubscribed for r in reports.values())
    note = "; oversubscribed: ranks share cores" if oversubscribed else ""
    ax_epoch.set(ylabel="seconds", title=f"one epoch of {epoch_samples} samples ({where}{note})")
    ax_epoch.title.set_fontsize(9)
    return fig


def plot_ooms(ooms: dict, capacity_bytes: int | None = None) -> Figure:
    """What each run had in use, by category, when it ran out of memory (``{label:
    DeviceOOM or None}``; None, a run that fitted, is left out), the failed allocation on top."""

    bars = [{"label": f"{label}\nrank {oom.rank}", "breakdown": oom.breakdown, "oom": True,
             "requested": oom.requested_bytes} for label, oom in ooms.items() if oom is not None]
    return plot_memory_bars(bars, capacity_bytes,
                            title="in use when the allocation failed, measured")
