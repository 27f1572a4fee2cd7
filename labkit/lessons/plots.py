"""Plots: each function takes results and returns a matplotlib Figure. Plots never launch."""

from labkit.lessons.all_reduce.plots import plot_all_reduce
from labkit.lessons.data_parallel.plots import (
    plot_batch_sweep,
    plot_losses,
    plot_speedup,
    plot_step_breakdown,
    plot_step_times,
)
from labkit.lessons.layouts.plots import plot_layout_run, plot_rank_grid, plot_scenario
from labkit.lessons.memory_wall.plots import (
    plot_boundary,
    plot_estimates,
    plot_memory_bars,
    plot_rank_memory,
)
from labkit.lessons.pipeline.plots import plot_gantt
from labkit.lessons.profiling.plots import plot_trace, plot_trace_totals
from labkit.lessons.profiling.trace import trace_agreement, trace_totals, trace_vs_clocks
from labkit.lessons.recommender.plots import (
    plot_ooms,
    plot_plan,
    plot_step_split,
    plot_table_memory,
    plot_training,
)
from labkit.lessons.sharding.plots import (
    plot_boundaries,
    plot_comm_price,
    plot_sharded_memory,
    plot_zero_stages,
)
from labkit.lessons.show.display import figure_png
from labkit.lessons.tensor_parallel.plots import plot_split_matmul, plot_tp_degrees, plot_tp_vs_ddp

__all__ = ["plot_boundaries", "plot_comm_price", "plot_sharded_memory", "plot_zero_stages",
           "figure_png", "plot_all_reduce", "plot_boundary", "plot_estimates", "plot_gantt",
           "plot_losses", "plot_batch_sweep",
           "plot_memory_bars", "plot_rank_memory", "plot_speedup", "plot_step_breakdown",
           "plot_step_times", "plot_split_matmul", "plot_tp_degrees", "plot_tp_vs_ddp"]
__all__ += ["plot_layout_run", "plot_rank_grid", "plot_scenario"]
__all__ += ["plot_trace", "plot_trace_totals", "trace_agreement", "trace_totals",
            "trace_vs_clocks"]
__all__ += ["plot_ooms", "plot_plan", "plot_step_split", "plot_table_memory", "plot_training"]
from labkit.lessons.data_parallel.overlap_plots import plot_bucket_timeline  # noqa: E402
from labkit.lessons.memory_wall.levers_plots import plot_levers  # noqa: E402

__all__ += ["plot_bucket_timeline", "plot_levers"]
from labkit.lessons.memory_wall.lever_boundary_plots import plot_lever_boundaries  # noqa: E402

__all__ += ["plot_lever_boundaries"]
