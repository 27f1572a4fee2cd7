"""Plots for composed layouts: the rank grid (which ranks form each group, one colour per
mesh dimension, lines as thick as the bytes that dimension carried), and a run's memory per
rank, step time per dimension and loss beside one device's."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

from labkit.lessons.memory_wall.plots import _scale, plot_memory_bars
from labkit.runtime.memory.units import format_bytes
from labkit.training.layout.layout import MESH_ORDER, Layout

DIM_COLORS = {"pp": "#8172B3", "dp": "#4C72B0", "fsdp": "#55A868", "tp": "#C44E52"}
DIM_NAMES = {"pp": "pipeline (pp)", "dp": "data parallel (dp)",
             "fsdp": "sharded data parallel (fsdp)", "tp": "tensor parallel (tp)"}


def grid_positions(layout: Layout) -> dict[int, tuple[int, int]]:
    """Where each rank sits in the drawing: column = its (fsdp, tp) position, row = its
    (pp, dp) position, so tp groups are neighbours in a row and pp groups share a column."""
    out = {}
    for rank in range(layout.size):
        c = layout.coordinates(rank)
        out[rank] = (c["fsdp"] * layout.tp + c["tp"], c["pp"] * layout.dp + c["dp"])
    return out


def group_links(layout: Layout) -> list[tuple[str, int, int]]:
    """(dimension, rank, next rank) for consecutive members of every group along every
    dimension of degree > 1: the lines of the grid."""
    return [(dim, a, b) for dim in MESH_ORDER if getattr(layout, dim) > 1
            for group in layout.groups(dim) for a, b in zip(group, group[1:], strict=False)]


def wire_bytes_by_dim(report) -> dict[str, int]:
    """Bytes one rank sent per step along each dimension (its last step, the most any rank
    sent): what a ring sends for each collective, the whole tensor for a pipeline's send."""
    out: dict[str, int] = {}
    for rank in report.ranks:
        for dim, stat in rank["records"][-1].get("comm_dims", {}).items():
            out[dim] = max(out.get(dim, 0), int(stat["wire_bytes"]))
    return out


def plot_rank_grid(layout: Layout, dim_bytes: dict[str, int] | None = None,
                   title: str | None = None) -> Figure:
    """The ranks of ``layout`` as a grid with every group linked in its dimension's colour.
    ``dim_bytes`` ({dimension: bytes per rank per step}, measured) sets each dimension's line
    width and adds a bar chart of who talks most."""
    cols = layout.fsdp * layout.tp
    rows = layout.pp * layout.dp
    panels = 2 if dim_bytes else 1
    fig = Figure(figsize=(max(4.5, 1.3 * cols + 2) + 4 * (panels - 1),
                          max(3.0, 1.1 * rows + 1.6)), layout="constrained")
    axes = fig.subplots(1, panels, squeeze=False, width_ratios=[1.4, 1][:panels])[0]
    _draw_grid(axes[0], layout, dim_bytes or {})
    axes[0].set_title(title or f"{layout.size} ranks as {layout}", fontsize=10)
    if dim_bytes:
        _draw_dim_bytes(axes[1], dim_bytes)
    return fig


def _draw_grid(ax, layout: Layout, dim_bytes: dict[str, int]) -> None:
    where = grid_positions(layout)
    biggest = max(dim_bytes.values(), default=0) or 1
    # a dimension's links bend on their own side, so that overlapping ones stay apart
    bend = {"tp": 0.0, "fsdp": -0.35, "dp": 0.0, "pp": 0.35}
    shown = set()
    for dim, a, b in group_links(layout):
        (xa, ya), (xb, yb) = where[a], where[b]
        width = 2.0 + 8.0 * dim_bytes.get(dim, 0) / biggest if dim_bytes else 3.0
        adjacent = abs(xa - xb) + abs(ya - yb) == 1
        label = None if dim in shown else f"{DIM_NAMES[dim]}: {getattr(layout, dim)} ranks"
        shown.add(dim)
        rad = 0.0 if adjacent else (bend[dim] or 0.3)
        ax.add_patch(FancyArrowPatch((xa, -ya), (xb, -yb), arrowstyle="-", lw=width,
                                     color=DIM_COLORS[dim], alpha=0.75, label=label, zorder=1,
                                     connectionstyle=f"arc3,rad={rad}"))
    for rank, (x, y) in where.items():
        ax.add_patch(FancyBboxPatch((x - 0.28, -y - 0.22), 0.56, 0.44, zorder=2,
                                    boxstyle="round,pad=0.02", fc="white", ec="black"))
        ax.text(x, -y, f"rank {rank}", ha="center", va="center", fontsize=8, zorder=3)
    cols = layout.fsdp * layout.tp
    rows = layout.pp * layout.dp
    ax.set(xlim=(-0.7, cols - 0.3), ylim=(-rows + 0.3, 0.9), aspect="equal")
    ax.axis("off")
    if shown:
        ax.legend(loc="upper center", fontsize=7, ncol=2, frameon=False)


def _draw_dim_bytes(ax, dim_bytes: dict[str, int]) -> None:
    dims = [d for d in MESH_ORDER if d in dim_bytes]
    values = [dim_bytes[d] for d in dims]
    scale, unit = _scale(max(values, default=1))
    y = np.arange(len(dims))
    ax.barh(y, [v / scale for v in values], color=[DIM_COLORS[d] for d in dims])
    for yi, value in zip(y, values, strict=True):
        ax.text(value / scale, yi, f" {format_bytes(value)}", va="center", fontsize=8)
    ax.set_yticks(y, dims)
    ax.invert_yaxis()
    ax.set_xlim(0, 1.4 * max(values, default=1) / scale or 1)
    ax.set_xlabel(f"{unit} one rank sent per step (measured)")
    ax.set_title("which groups talk most", fontsize=10)


def step_split_by_dim(report) -> dict[str, float]:
    """The median step, in seconds: computation, then the exposed communication shared out
    among dimensions in proportion to each one's time inside collectives in that step."""
    split = report.split()
    busy: dict[str, float] = {}
    for rank in report.ranks:  # the last step's time in collectives, slowest rank per dim
        for dim, stat in rank["records"][-1].get("comm_dims", {}).items():
            busy[dim] = max(busy.get(dim, 0.0), stat["seconds"])
    total = sum(busy.values())
    out = {"compute": split["compute_s"]}
    for dim in MESH_ORDER:
        if dim in busy:
            out[dim] = split["comm_s"] * busy[dim] / total if total else 0.0
    return out


def plot_layout_run(report, reference=None, capacity_bytes: int | None = None,
                    oom=None) -> Figure:
    """One layout's run: peak memory per rank by category; the median step split into
    computation and communication per dimension; its loss on top of ``reference``'s (one
    device). ``oom`` (a DeviceOOM) draws what the failing rank held instead."""
    fig = Figure(figsize=(13, 3.8), layout="constrained")
    mem_ax, time_ax, loss_ax = fig.subplots(1, 3, width_ratios=[1.5, 1, 1.3])
    if oom is not None:
        bars = [{"label": f"rank {oom.rank}", "breakdown": oom.breakdown, "oom": True,
                 "requested": oom.requested_bytes}]
    else:
        bars = [{"label": f"rank {r}", "breakdown": rank["memory"]["at_peak"]}
                for r, rank in enumerate(report.ranks)]
    plot_memory_bars(bars, capacity_bytes, ax=mem_ax, title="peak memory per rank, measured")
    if report is None:
        for ax in (time_ax, loss_ax):
            ax.text(0.5, 0.5, "out of memory:\nno step to time", ha="center", va="center")
            ax.axis("off")
        return fig
    parts = step_split_by_dim(report)
    bottom = 0.0
    for name, seconds in parts.items():
        color = DIM_COLORS.get(name, "#999999")
        label = "computation" if name == "compute" else f"communication: {name}"
        time_ax.bar([0], [seconds * 1e3], 0.5, bottom=bottom, color=color, label=label)
        bottom += seconds * 1e3
    time_ax.set_xticks([0], [str(report.layout)])
    note = " (ranks share cores)" if report.oversubscribed else ""
    time_ax.set(ylabel="median step (ms)", xlim=(-0.8, 0.8))
    time_ax.set_title(f"step time, measured{note}", fontsize=9)
    time_ax.legend(fontsize=7)
    if reference is not None:
        loss_ax.plot(reference.losses, "o-", color="black", label="one device", lw=3, alpha=0.3)
    loss_ax.plot(report.losses, ".-", color="#C44E52", label=str(report.layout))
    loss_ax.set(xlabel="step", ylabel="loss")
    loss_ax.set_title("loss, on top of one device's", fontsize=9)
    loss_ax.legend(fontsize=7)
    return fig


def plot_scenario(runs: dict, capacity_bytes: int | None = None) -> Figure:
    """The fullest rank of each run ({name: TrainReport or DeviceOOM}), by category, under
    the cap: what fits and what ran out of memory (hatched: the allocation that failed)."""
    bars = []
    for name, run in runs.items():
        if hasattr(run, "requested_bytes"):  # a DeviceOOM
            bars.append({"label": name, "breakdown": run.breakdown, "oom": True,
                         "requested": run.requested_bytes})
        else:
            fullest = max(run.ranks, key=lambda r: r["memory"]["peak_bytes"])
            bars.append({"label": name, "breakdown": fullest["memory"]["at_peak"]})
    return plot_memory_bars(bars, capacity_bytes,
                            title="the fullest rank of each run, measured (hatched: OOM)")



def describe_runs(runs: dict, reference, capacity_bytes: int) -> str:
    """One line per run ({name: TrainReport or DeviceOOM}): out of memory, or its fullest
    rank's peak, the weights and optimizer state it held there as fractions of one device's
    (Adam's: two moments per weight), the bytes one rank sent per step along each dimension,
    and its median step split into computation and each dimension's communication (ms).
    ``reference``: the same training on one device without a cap (what it needs)."""
    need = max(reference.peak_bytes)
    weights = reference.ranks[0]["memory"]["category_peaks"]["parameters"]
    whole = {"parameters": weights, "optimizer": 2 * weights}
    lines = [f"one device, without a cap, peaks at {format_bytes(need)}: "
             f"{need / capacity_bytes:.2f}x the {format_bytes(capacity_bytes)} cap"]
    for name, run in runs.items():
        if hasattr(run, "requested_bytes"):  # a DeviceOOM
            lines.append(f"{name}: out of memory on rank {run.rank}")
            continue
        fullest = max(run.ranks, key=lambda r: r["memory"]["peak_bytes"])["memory"]
        held = ", ".join(f"{c} {fullest['at_peak'][c] / whole[c]:.2f}" for c in whole)
        sent = ", ".join(f"{d} {format_bytes(b)}" for d, b in wire_bytes_by_dim(run).items())
        split = ", ".join(f"{'computation' if k == 'compute' else k} {v * 1e3:.0f}"
                          for k, v in step_split_by_dim(run).items())
        note = "; ranks sharing cores" if run.oversubscribed else ""
        lines.append(f"{name} ({run.layout}): fits, peak {format_bytes(fullest['peak_bytes'])}"
                     f" ({held} of one device's); sent per rank and step: {sent}; median "
                     f"step {run.median_step_s * 1e3:.0f} ms ({split}{note})")
    return "\n".join(lines)
