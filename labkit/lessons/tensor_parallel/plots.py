"""Plots of tensor parallelism: which rank holds which block of a split matrix multiply; TP's
traffic beside DDP's as the batch grows; memory and traffic per TP degree."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from labkit.lessons.memory_wall.plots import COLORS as MEMORY_COLORS
from labkit.lessons.memory_wall.plots import _scale
from labkit.runtime.memory.oom import CATEGORIES
from labkit.runtime.memory.units import format_bytes

RANK_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860", "#DA8BC3",
               "#8C8C8C"]
EVERY_RANK = "#D9D9D9"
STRATEGY_COLORS = {"tp": "#C44E52", "ddp": "#4C72B0"}


def _grid(ax, values, left: float, colors, label: str) -> float:
    """Draw matrix ``values`` with its top-left corner at (left, 0), one colour per cell;
    return where it ends on the x axis."""
    rows, cols = values.shape
    for i in range(rows):
        for j in range(cols):
            ax.add_patch(Rectangle((left + j, -i - 1), 1, 1, facecolor=colors(i, j),
                                   edgecolor="white", lw=1.5))
            ax.text(left + j + 0.5, -i - 0.5, f"{values[i, j]:g}", ha="center", va="center",
                    fontsize=7)
    ax.text(left + cols / 2, 0.25, label, ha="center", va="bottom", fontsize=8)
    return left + cols


def _between(ax, x: float, rows: int, text: str, width: float = 1.2) -> float:
    ax.text(x + width / 2, -rows / 2, text, ha="center", va="center", fontsize=9)
    return x + width


def _owner(index: int, size: int, world_size: int) -> str:
    """The colour of the rank that holds ``index`` of a dimension of ``size`` split N ways."""
    return RANK_COLORS[index * world_size // size]


def _split_row(ax, demo, mode: str) -> None:
    """One split drawn left to right: X @ W = each rank's piece -> the joined Y."""
    n, m = demo.world_size, demo.x.shape[0]
    k, cols = demo.w.shape
    if mode == "column":  # the whole X everywhere; W and Y by columns
        def x_color(i, j):
            return EVERY_RANK

        def w_color(i, j):
            return _owner(j, cols, n)

        y_color, pieces, joined = w_color, demo.column_blocks, demo.column_result
        link = "all-gather\n(side by side)"
    else:  # X by columns and W by rows: the inner dimension; Y is a sum, whole everywhere
        def x_color(i, j):
            return _owner(j, k, n)

        def w_color(i, j):
            return _owner(i, k, n)

        y_color, pieces, joined = _every_rank, demo.row_partials, demo.row_result
        link = "all-reduce\n(sum)"
    at = _grid(ax, demo.x.numpy(), 0, x_color, "X")
    at = _between(ax, at, m, "@")
    at = _grid(ax, demo.w.numpy(), at, w_color, "W")
    at = _between(ax, at, m, "→")
    for rank, piece in enumerate(pieces):
        at = _grid(ax, piece.numpy(), at, lambda i, j, r=rank: RANK_COLORS[r],
                   f"rank {rank}") + 0.4
    at = _between(ax, at - 0.4, m, link, width=3.0)
    at = _grid(ax, joined.numpy(), at, y_color, "Y on every rank")
    ax.set(xlim=(-0.3, at + 0.3), ylim=(-max(m, k) - 0.3, 1.2), aspect="equal")
    ax.axis("off")


def _every_rank(i: int, j: int) -> str:
    return EVERY_RANK


def plot_split_matmul(demo) -> Figure:
    """Y = X @ W split by columns of W (top) and by rows of W (bottom): each colour is the
    rank that holds a block; grey is held whole by every rank."""
    n, errors = demo.world_size, demo.errors()
    fig = Figure(figsize=(12, 4.6), layout="constrained")
    top, bottom = fig.subplots(2, 1)
    _split_row(top, demo, "column")
    top.set_title("split W by columns: each rank computes its columns of Y from the whole X",
                  fontsize=9)
    _split_row(bottom, demo, "row")
    bottom.set_title("split W by rows (the inner dimension): each rank computes a partial Y "
                     "from its slice of X", fontsize=9)
    handles = [Patch(color=RANK_COLORS[r], label=f"rank {r}") for r in range(n)]
    handles.append(Patch(color=EVERY_RANK, label="whole, on every rank"))
    fig.legend(handles=handles, loc="outside lower center", ncols=n + 1, fontsize=8)
    fig.suptitle(f"ran on {n} ranks here; largest difference from X @ W in one piece: "
                 f"{errors['column']:g} (columns), {errors['row']:g} (rows)", fontsize=9)
    return fig


def plot_tp_vs_ddp(result) -> Figure:
    """Left: bytes communicated per step against the global batch, TP and DDP, as measured.
    Right: the median step, computation and exposed communication, for each."""
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_bytes, ax_time = fig.subplots(1, 2)
    batches = result.batches
    for strategy, label in (("tp", "tensor parallel: activations, in every split layer"),
                            ("ddp", "DDP: gradients, once per step")):
        values = result.series(strategy, "bytes")
        calls = max(result.series(strategy, "calls"))
        ax_bytes.plot(batches, values, "o-", color=STRATEGY_COLORS[strategy],
                      label=f"{label} ({calls} all-reduce(s) per step)")
        above = strategy == "ddp"  # TP's labels under its points: where the lines cross,
        for b, v in zip(batches, values, strict=True):  # the two labels would overlap
            ax_bytes.annotate(format_bytes(v), (b, v), fontsize=7, textcoords="offset points",
                              xytext=(-4, 6 if above else -6), va="bottom" if above else "top",
                              ha="right" if b == batches[-1] else "left")
    ax_bytes.set(xscale="log", yscale="log", xlabel="global batch (samples per step)",
                 ylabel="bytes all-reduced per step",
                 title=f"{result.model} ({result.params / 1e6:.2g}M params) on "
                       f"{result.world_size} ranks: measured here")
    ax_bytes.set_xticks(batches, [str(b) for b in batches])
    ax_bytes.minorticks_off()
    ax_bytes.title.set_fontsize(9)
    ax_bytes.legend(fontsize=7, loc="upper left")
    x = np.arange(len(batches))
    for offset, strategy in ((-0.2, "tp"), (0.2, "ddp")):
        compute = np.array(result.series(strategy, "compute_s")) * 1e3
        comm = np.array(result.series(strategy, "comm_s")) * 1e3
        ax_time.bar(x + offset, compute, 0.38, color=STRATEGY_COLORS[strategy], alpha=0.55,
                    label=f"{strategy}: computation")
        ax_time.bar(x + offset, comm, 0.38, bottom=compute, color=STRATEGY_COLORS[strategy],
                    hatch="//", edgecolor="white", label=f"{strategy}: communication (exposed)")
    note = " (CPU ranks: loopback links)" if result.device == "cpu" else ""
    note += ", oversubscribed" if result.oversubscribed else ""
    ax_time.set_xticks(x, [str(b) for b in batches])
    ax_time.set(xlabel="global batch", ylabel="ms per step (median)",
                title=f"step time, measured here{note}")
    ax_time.title.set_fontsize(9)
    ax_time.legend(fontsize=7, loc="upper left")
    return fig


def plot_tp_degrees(points: dict, capacity_bytes: int | None = None) -> Figure:
    """Per TP degree (``{degree: TrainReport}``, 1 = one device): left, the memory peak of
    the fullest rank by category; right, the bytes all-reduced per step, with the calls and
    the time spent inside collectives."""
    degrees = sorted(points)
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    ax_mem, ax_comm = fig.subplots(1, 2)
    x = np.arange(len(degrees))
    peaks = [max(points[d].ranks, key=lambda r: r["memory"]["peak_bytes"])["memory"]["at_peak"]
             for d in degrees]
    scale, unit = _scale(max([p["total"] for p in peaks] + [capacity_bytes or 0]))
    bottom = np.zeros(len(degrees))
    for category in CATEGORIES:
        values = np.array([p.get(category, 0) for p in peaks]) / scale
        ax_mem.bar(x, values, 0.6, bottom=bottom, color=MEMORY_COLORS[category], label=category)
        bottom += values
    if capacity_bytes:
        ax_mem.axhline(capacity_bytes / scale, color="black", ls="--", lw=1.2,
                       label=f"capacity {format_bytes(capacity_bytes)}")
    labels = [f"{d}" + ("*" if points[d].oversubscribed else "") for d in degrees]
    ax_mem.set_xticks(x, labels)
    ax_mem.set(xlabel="TP degree (devices; * = oversubscribed)", ylabel=f"peak ({unit})",
               ylim=(0, 1.15 * max(bottom.max(), (capacity_bytes or 0) / scale)),
               title="memory of one device at its peak, measured here")
    ax_mem.title.set_fontsize(9)
    ax_mem.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
    records = [points[d].ranks[0]["records"][-1] for d in degrees]
    comm = np.array([r["comm_bytes"] for r in records], dtype=float)
    comm_scale, comm_unit = _scale(comm.max() or 1)
    ax_comm.bar(x, comm / comm_scale, 0.6, color=STRATEGY_COLORS["tp"])
    for xi, value, r in zip(x, comm / comm_scale, records, strict=True):
        ax_comm.text(xi, value, f"{format_bytes(r['comm_bytes'])}\n{r['comm_calls']} "
                     f"all-reduce(s)\n{r['comm_busy_s'] * 1e3:.1f} ms in them", ha="center",
                     va="bottom", fontsize=7)
    ax_comm.set_xticks(x, labels)
    ax_comm.set(xlabel="TP degree", ylabel=f"all-reduced per step ({comm_unit})",
                ylim=(0, 1.5 * (comm.max() / comm_scale or 1)),
                title="communication per step, measured here")
    ax_comm.title.set_fontsize(9)
    return fig
