"""Sharded data parallelism, interactively: a GPU-count slider; DDP, ZeRO-1 and FSDP are
trained for real at that count (cached), and their memory per rank and traffic redraw."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.lessons.sharding.compare import ShardingComparison, compare_sharding
from labkit.lessons.sharding.plots import plot_sharded_memory
from labkit.runtime.memory.units import format_bytes


class ShardingExplorer:
    """Measured rows per (strategy, world size), trained on first use."""

    def __init__(self, cluster, config, world_sizes=(1, 2, 4),
                 strategies=("ddp", "zero1", "fsdp"), capacity_bytes: int | None = None,
                 measured: ShardingComparison | None = None):
        self.cluster, self.config = cluster, config
        self.world_sizes, self.strategies = sorted(world_sizes), tuple(strategies)
        self.capacity_bytes = capacity_bytes
        self._measured: dict[int, ShardingComparison] = {}
        for n in measured.world_sizes if measured is not None else ():
            # runs already made (compare_sharding in an earlier cell) are not repeated
            rows = [r for r in measured.rows if r.world_size == n and r.strategy in strategies]
            if {r.strategy for r in rows} == set(strategies):
                self._measured[n] = ShardingComparison(measured.model, measured.params,
                                                       measured.global_batch, rows)

    def comparison(self, world_size: int) -> ShardingComparison:
        if world_size not in self._measured:
            self._measured[world_size] = compare_sharding(self.cluster, self.config,
                                                          self.strategies, (world_size,))
        return self._measured[world_size]

    def figure(self, world_size: int) -> Figure:
        return plot_sharded_memory(self.comparison(world_size), self.capacity_bytes)

    def message(self, world_size: int) -> str:
        rows = self.comparison(world_size).rows
        return "<br>".join(f"<b>{r.strategy}</b>: peak {format_bytes(r.peak_bytes)} per rank; "
                           f"{format_bytes(r.comm_wire_bytes)} sent per step; median "
                           f"step {r.step_s * 1e3:.1f} ms, {r.comm_s * 1e3:.1f} ms of it waiting"
                           for r in rows)

    def widget(self, world_size: int | None = None, background: bool = True):
        from labkit.lessons.show.controls import gpu_count_slider
        from labkit.lessons.show.render import slider_panel

        gpus = gpu_count_slider(self.world_sizes, world_size)
        box = slider_panel([gpus], self.figure,
                           lambda n: f"training ddp, zero1 and fsdp on {n} GPU(s)",
                           self.message, background=background)
        box.gpus = gpus
        return box


def sharding_explorer(cluster, config, world_sizes=(1, 2, 4), world_size: int | None = None,
                      interactive: bool = True, **options):
    """A GPU-count slider over DDP / ZeRO-1 / FSDP runs of ``config``; headless, the Figure
    for ``world_size`` (default: the largest). ``measured=`` a ShardingComparison of the same
    config reuses its runs."""
    explorer = ShardingExplorer(cluster, config, world_sizes, **options)
    world = world_size or explorer.world_sizes[-1]
    return explorer.widget(world) if interactive else explorer.figure(world)
