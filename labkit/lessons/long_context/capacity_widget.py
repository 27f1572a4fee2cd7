"""The capacity factor slider: per factor a real MoE run, its tokens taken and dropped per
expert and the router's heat map (``labkit/lessons/long_context/capacity.py`` caches the runs)."""

from __future__ import annotations

import dataclasses

from labkit.lessons.long_context.capacity import CapacityExplorer
from labkit.lessons.long_context.capacity_plots import plot_capacity


def capacity_slider(cluster, config, layout, factors, value: float | None = None,
                    interactive: bool = True, explorer: CapacityExplorer | None = None,
                    background: bool = True):
    """A slider over ``factors``; headless (``interactive=False``), the Figure at ``value``.
    ``explorer``: one whose runs are reused (the same config, layout and cluster)."""
    factors = [float(f) for f in factors]
    if not factors:
        raise ValueError("capacity_slider needs at least one capacity factor, e.g. [1.0, 2.0]")
    value = factors[0] if value is None else float(value)
    if value not in factors:
        raise ValueError(f"capacity factor {value:g} is not one of the slider's {factors}")
    explorer = explorer or CapacityExplorer(cluster, config, layout)
    if (explorer.cluster, explorer.config, explorer.layout) != (cluster, config, layout):
        raise ValueError("the explorer was made for another cluster, config or layout: pass "
                         "CapacityExplorer(cluster, config, layout) for these, or none")
    for factor in factors:  # a bad factor refused now, not after the first runs trained
        dataclasses.replace(config.model, capacity_factor=factor)

    def figure(factor):
        return plot_capacity(explorer.run(factor))

    if not interactive:
        return figure(value)
    import ipywidgets as widgets

    from labkit.lessons.show.render import slider_panel

    slider = widgets.SelectionSlider(options=factors, value=value,
                                     description="capacity factor", continuous_update=False,
                                     layout={"width": "450px"},
                                     style={"description_width": "initial"})
    box = slider_panel([slider], figure, lambda f: f"training at capacity factor {f:g}",
                       explorer.message, background)
    box.slider, box.explorer = slider, explorer
    return box
