"""Plots: each function takes results and returns a matplotlib Figure. Plots never launch."""

from labkit.plots.comm import plot_all_reduce
from labkit.plots.display import figure_png, register_ipython_display
from labkit.plots.memory import (
    plot_boundary,
    plot_estimates,
    plot_memory_bars,
    plot_rank_memory,
)
from labkit.plots.pipeline import plot_gantt
from labkit.plots.scaling import plot_losses, plot_speedup, plot_step_breakdown, plot_step_times

register_ipython_display()

__all__ = ["figure_png", "plot_all_reduce", "plot_boundary", "plot_estimates", "plot_gantt",
           "plot_losses",
           "plot_memory_bars", "plot_rank_memory", "plot_speedup", "plot_step_breakdown",
           "plot_step_times"]
