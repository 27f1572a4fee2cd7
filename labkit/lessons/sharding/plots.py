"""Plots for sharded data parallelism: what ZeRO's stages keep per device, measured memory
per rank for DDP / ZeRO-1 / FSDP, the OOM boundary of each, and the traffic each pays."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from labkit.lessons.memory_wall.plots import _scale, plot_boundary, plot_memory_bars
from labkit.runtime.costs import model_state_bytes
from labkit.runtime.memory.units import format_bytes

STAGES = {0: "DDP\n(stage 0)", 1: "ZeRO-1\noptimizer", 2: "ZeRO-2\n+ gradients",
          3: "ZeRO-3 / FSDP\n+ parameters"}
KIND_COLORS = {"all_reduce": "#4C72B0", "broadcast": "#8172B3", "all_gather": "#55A868",
               "reduce_scatter": "#DD8452", "all_to_all": "#937860"}


def plot_zero_stages(n_params: float, world_size: int, precision: str = "mixed",
                     capacity_bytes: int | None = None) -> Figure:
    """Model-state bytes per device under each ZeRO stage (the paper's formula: projected,
    not measured; activations come on top)."""
    bars = []
    for stage, label in STAGES.items():
        state = model_state_bytes(n_params, world_size, stage, precision)
        bars.append({"label": label, "breakdown": {k: state[k] for k in
                                                   ("parameters", "gradients", "optimizer")}})
    title = (f"model states per device, {n_params / 1e9:.3g}B parameters on {world_size} "
             f"devices, {precision} Adam\n(projected with the ZeRO paper's formula)")
    return plot_memory_bars(bars, capacity_bytes, title=title)


def plot_sharded_memory(comparison, capacity_bytes: int | None = None) -> Figure:
    """Measured peak per rank by category for every (strategy, world size), the estimate
    marked on each bar."""
    bars = [{"label": f"{row.strategy}\n{row.world_size} GPU{'s' if row.world_size > 1 else ''}",
             "breakdown": row.at_peak, "estimate": row.estimated_bytes}
            for n in comparison.world_sizes for row in comparison.rows if row.world_size == n]
    title = (f"peak memory per rank, measured here ({comparison.model}, "
             f"{comparison.params / 1e6:.2g}M parameters, batch {comparison.global_batch})")
    return plot_memory_bars(bars, capacity_bytes, title=title)


def plot_comm_price(comparison, world_size: int | None = None) -> Figure:
    """What the memory saving costs at ``world_size`` ranks: bytes each rank sends per step
    (on a ring: 2(N-1)/N of the tensor for AllReduce, (N-1)/N for the others), by kind of
    collective, and the step split into computation and exposed communication."""
    world_size = world_size or comparison.world_sizes[-1]
    rows = [r for r in comparison.rows if r.world_size == world_size]
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    left, right = fig.subplots(1, 2)
    x = np.arange(len(rows))
    scale, unit = _scale(max(r.comm_wire_bytes for r in rows) or 1)
    bottom = np.zeros(len(rows))
    for kind, color in KIND_COLORS.items():
        values = np.array([r.comm_kinds.get(kind, [0, 0, 0])[2] for r in rows]) / scale
        if values.any():
            left.bar(x, values, 0.6, bottom=bottom, color=color, label=kind.replace("_", "-"))
            bottom += values
    for xi, row in zip(x, rows, strict=True):
        calls = sum(counts[0] for counts in row.comm_kinds.values())
        left.text(xi, bottom[xi], f"{format_bytes(row.comm_wire_bytes)}\n{calls} calls",
                  ha="center", va="bottom", fontsize=7)
    left.set_xticks(x, [r.strategy for r in rows])
    left.set(ylabel=f"bytes sent per rank per step ({unit})",
             ylim=(0, 1.3 * max(bottom.max(), 1e-9)))
    left.set_title(f"traffic per step on {world_size} ranks (what a ring sends per rank "
                   "for the collectives counted)", fontsize=9)
    left.legend(fontsize=7)
    compute = np.array([(r.step_s - r.comm_s) * 1e3 for r in rows])
    exposed = np.array([r.comm_s * 1e3 for r in rows])
    right.bar(x, compute, 0.6, color="#4C72B0", label="computation")
    right.bar(x, exposed, 0.6, bottom=compute, color="#C44E52", label="waiting on collectives")
    right.set_xticks(x, [r.strategy for r in rows])
    note = " (ranks share cores)" if any(r.oversubscribed for r in rows) else ""
    right.set(ylabel="median step (ms)")
    right.set_title(f"time per step, measured here{note}", fontsize=9)
    right.legend(fontsize=7)
    return fig


def plot_boundaries(maps: list) -> Figure:
    """The OOM boundary map of each strategy, side by side on the same grid and capacity."""
    width = sum(1.4 * len(m.world_sizes) + 1.5 for m in maps)
    fig = Figure(figsize=(max(9.0, width), 0.55 * len(maps[0].sizes) + 2.4),
                 layout="constrained")
    for ax, boundary in zip(fig.subplots(1, len(maps), squeeze=False)[0], maps, strict=True):
        plot_boundary(boundary, ax=ax)
        ax.set_title(f"{boundary.strategy}", fontsize=10)
    fig.suptitle(f"{maps[0].model} under a {format_bytes(maps[0].capacity_bytes)} cap per "
                 "device: green trained, red OOM (measured); black line: estimator",
                 fontsize=9)
    return fig



