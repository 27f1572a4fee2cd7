"""Plots: each function takes results and returns a matplotlib Figure. Plots never launch."""

from labkit.plots.comm import plot_all_reduce
from labkit.plots.display import figure_png, register_ipython_display
from labkit.plots.embedding import (
    plot_ooms,
    plot_plan,
    plot_step_split,
    plot_table_memory,
    plot_training,
)
from labkit.plots.layout import plot_layout_run, plot_rank_grid, plot_scenario
from labkit.plots.memory import (
    plot_boundary,
    plot_estimates,
    plot_memory_bars,
    plot_rank_memory,
)
from labkit.plots.pipeline import plot_gantt
from labkit.plots.scaling import (
    plot_batch_sweep,
    plot_losses,
    plot_speedup,
    plot_step_breakdown,
    plot_step_times,
)
from labkit.plots.sharding import (
    plot_boundaries,
    plot_comm_price,
    plot_sharded_memory,
    plot_zero_stages,
)
from labkit.plots.tensor_parallel import plot_split_matmul, plot_tp_degrees, plot_tp_vs_ddp

register_ipython_display()

__all__ = ["plot_boundaries", "plot_comm_price", "plot_sharded_memory", "plot_zero_stages",
           "figure_png", "plot_all_reduce", "plot_boundary", "plot_estimates", "plot_gantt",
           "plot_losses", "plot_batch_sweep",
           "plot_memory_bars", "plot_rank_memory", "plot_speedup", "plot_step_breakdown",
           "plot_step_times", "plot_split_matmul", "plot_tp_degrees", "plot_tp_vs_ddp"]
__all__ += ["plot_layout_run", "plot_rank_grid", "plot_scenario"]
__all__ += ["plot_ooms", "plot_plan", "plot_step_split", "plot_table_memory", "plot_training"]
from labkit.plots.levers import plot_levers  # noqa: E402
from labkit.plots.overlap import plot_bucket_timeline  # noqa: E402

__all__ += ["plot_bucket_timeline", "plot_levers"]
from labkit.plots.lever_boundary import plot_lever_boundaries  # noqa: E402

__all__ += ["plot_lever_boundaries"]
