"""The recommender at scale, interactively: sliders for the GPU count and the table size; for
each setting the planner's estimate per rank, and the measured peak (or the OOM) beside it."""

from __future__ import annotations

import dataclasses

import numpy as np
from matplotlib.figure import Figure

from labkit.lessons.memory_wall.plots import _scale
from labkit.lessons.recommender.plots import PART_COLORS, PART_LABELS
from labkit.parallel.embedding.placement import PlacementError
from labkit.parallel.embedding.results import memory_by_part
from labkit.parallel.embedding.sizing import dlrm_plan
from labkit.runtime.memory.oom import DeviceOOM
from labkit.runtime.memory.units import format_bytes, parse_bytes
from labkit.training.api import train


class RecommenderExplorer:
    """Planned and measured memory per rank for (GPU count, rows per table), cached;
    ``reports`` ({(GPU count, rows): TrainReport}) hands over runs already made with this
    config, strategy and capacity."""

    def __init__(self, cluster, config, rows_options, gpu_options=(1, 2, 4),
                 memory_per_device="8MiB", strategy: str = "table_wise",
                 reports: dict | None = None):
        self.cluster, self.config, self.strategy = cluster, config, strategy
        self.rows_options, self.gpu_options = sorted(rows_options), sorted(gpu_options)
        self.capacity = parse_bytes(memory_per_device)
        self._cache: dict[tuple[int, int], dict] = {}
        self._reports = dict(reports or {})

    def config_for(self, rows: int):
        model = dataclasses.replace(self.config.model, rows_per_table=rows)
        return self.config.replace(model=model, strategy=self.strategy, return_weights=False)

    def table_bytes(self, rows: int) -> int:
        return rows * self.config.model.embedding_dim * 4

    def result(self, world_size: int, rows: int) -> dict:
        """{"plan", "plan_fits", "report" or "oom", "fits"}: estimated, then measured."""

        key = (world_size, rows)
        if key not in self._cache:
            config = self.config_for(rows)
            try:
                plan = dlrm_plan(config, world_size, self.capacity,
                                 row_wise=self.strategy == "row_wise")
            except PlacementError:
                plan = dlrm_plan(config, world_size, self.capacity, row_wise=True)
            out = {"plan": plan, "plan_fits": plan.fits, "report": self._reports.get(key),
                   "oom": None}
            if out["report"] is None:
                out["report"], out["oom"] = self._train(world_size, config)
            out["fits"] = out["oom"] is None
            self._cache[key] = out
        return self._cache[key]

    def _train(self, world_size: int, config) -> tuple:
        """(report, None), or (None, DeviceOOM) when the run does not fit."""
        with self.cluster.resized(world_size):  # and back to the rank count it had
            try:
                return train(self.cluster, config, memory_per_device=self.capacity,
                             estimate=False), None
            except DeviceOOM as oom:
                return None, oom

    def figure(self, world_size: int, rows: int) -> Figure:

        result = self.result(world_size, rows)
        plan, report, oom = result["plan"], result["report"], result["oom"]
        fig = Figure(figsize=(max(6.5, 1.5 * world_size + 4.5), 3.8), layout="constrained")
        ax = fig.subplots()
        measured = memory_by_part(report) if report else []
        tops = plan.total_bytes + [m["peak"] for m in measured] + [self.capacity]
        if oom is not None:
            tops.append(oom.in_use_bytes + oom.requested_bytes)
        scale, unit = _scale(max(tops))
        x = np.arange(world_size)
        ax.bar(x - 0.2, np.array(plan.total_bytes) / scale, 0.38, color="white",
               edgecolor="black", hatch="..", label="planned (estimate)")
        bottom = np.zeros(world_size)
        for part in PART_COLORS:
            values = np.array([m[part] for m in measured] or [0] * world_size) / scale
            ax.bar(x + 0.2, values, 0.38, bottom=bottom, color=PART_COLORS[part],
                   label=f"measured: {PART_LABELS[part]}")
            bottom += values
        if oom is not None:
            ax.bar(oom.rank + 0.2, oom.in_use_bytes / scale, 0.38, color="#C44E52",
                   label="measured: in use at the OOM")
            ax.bar(oom.rank + 0.2, oom.requested_bytes / scale, 0.38,
                   bottom=oom.in_use_bytes / scale, color="white", edgecolor="firebrick",
                   hatch="//", label="allocation that failed")
        ax.axhline(self.capacity / scale, color="black", ls="--", lw=1.5,
                   label=f"capacity {format_bytes(self.capacity)}")
        ax.set_xticks(x, [f"rank {r}" for r in range(world_size)])
        ax.set(ylabel=f"bytes ({unit})", ylim=(0, 1.15 * max(tops) / scale))
        ax.set_title(f"{self.strategy}, {world_size} GPU(s), tables of "
                     f"{format_bytes(self.table_bytes(rows))}\n{self._verdict(result)}",
                     fontsize=9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))
        return fig

    @staticmethod
    def _verdict(result: dict) -> str:
        plan = "plan: fits" if result["plan_fits"] else "plan: does not fit"
        return f"{plan}; measured: {'fits' if result['fits'] else 'out of memory'}"

    def message(self, world_size: int, rows: int) -> str:
        result = self.result(world_size, rows)
        if result["oom"] is not None:
            return f"<b>{self._verdict(result)}</b>. DeviceOOM: {result['oom']}"
        peak = max(result["report"].peak_bytes)
        return (f"<b>{self._verdict(result)}</b>: highest measured peak {format_bytes(peak)} "
                f"of {format_bytes(self.capacity)}. {result['plan'].explain()}")

    def widget(self, world_size: int | None = None, rows: int | None = None,
               background: bool = True):
        import ipywidgets as widgets

        from labkit.lessons.show.controls import gpu_count_slider
        from labkit.lessons.show.render import slider_panel

        gpus = gpu_count_slider(self.gpu_options, world_size)
        size = widgets.SelectionSlider(
            options=[(f"{format_bytes(self.table_bytes(r))} each", r) for r in self.rows_options],
            value=rows or self.rows_options[0], description="table size",
            continuous_update=False, layout={"width": "450px"})
        box = slider_panel([gpus, size], self.figure,
                           lambda n, r: f"training on {n} GPU(s), tables of "
                                        f"{format_bytes(self.table_bytes(r))}",
                           self.message, background)
        box.gpus, box.size = gpus, size
        return box


def recommender_explorer(cluster, config, rows_options, gpu_options=(1, 2, 4),
                         memory_per_device="8MiB", strategy: str = "table_wise",
                         world_size: int | None = None, rows: int | None = None,
                         interactive: bool = True, reports: dict | None = None):
    """GPU-count and table-size sliders over real sharded runs under one capacity; headless,
    the Figure for ``world_size`` and ``rows``."""
    explorer = RecommenderExplorer(cluster, config, rows_options, gpu_options,
                                   memory_per_device, strategy, reports)
    world_size = world_size or explorer.gpu_options[-1]
    rows = rows if rows in explorer.rows_options else explorer.rows_options[0]
    if interactive:
        return explorer.widget(world_size, rows)
    return explorer.figure(world_size, rows)
