"""The memory levers of one device, side by side: peak by category, and step time."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.memory_wall.plots import plot_memory_bars
from labkit.runtime.memory.units import format_bytes


def plot_levers(runs, capacity_bytes: int | None = None, title: str = "") -> Figure:
    """Left: each run's measured peak by category (hatched: the allocation that did not
    fit), the estimate as a tick; right: its median step time, measured here, beside the
    plain run's (the first)."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    ax_mem, ax_time = fig.subplots(1, 2, width_ratios=[3, 2])
    bars = []
    for run in runs:
        bar = {"label": run.name.replace(" + ", "\n+ "), "breakdown": run.at_peak}
        if run.oom:
            bar.update(oom=True, requested=run.oom["requested"])
        else:
            bar["estimate"] = run.estimated_bytes
        bars.append(bar)
    plot_memory_bars(bars, capacity_bytes, title=title or "peak memory, measured", ax=ax_mem)
    plain = runs[0].step_s
    names = [run.name for run in runs]
    times = [1e3 * run.step_s if run.step_s else 0.0 for run in runs]
    ax_time.barh(names, times, color="tab:blue")
    for y, run in enumerate(runs):
        note = ("out of memory" if run.oom else
                f"{run.step_s / plain:.2f}x" if plain else format_bytes(run.peak_bytes))
        ax_time.text(times[y], y, f" {note}", va="center")
    ax_time.invert_yaxis()
    ax_time.set(xlabel="median step (ms), measured here", title="step time")
    ax_time.margins(x=0.3)
    return fig
