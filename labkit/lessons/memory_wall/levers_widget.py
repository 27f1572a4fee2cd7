"""Before buying more GPUs: pick memory levers, train for real, see memory and time beside
the plain run."""

from __future__ import annotations

from labkit.lessons.memory_wall.levers import LeverPicker
from labkit.lessons.memory_wall.levers_plots import plot_levers
from labkit.runtime.memory.units import format_bytes


def _message(plain, chosen) -> str:
    if chosen.oom:
        return (f"{chosen.name}: out of memory (asked {format_bytes(chosen.oom['requested'])} "
                f"more at {format_bytes(chosen.peak_bytes)} in use).")
    if plain.oom:  # no plain peak or step to compare with: say what this run did alone
        return (f"{chosen.name}: fits, peak {format_bytes(chosen.peak_bytes)}, step "
                f"{chosen.step_s * 1e3:.1f} ms, measured here; the plain run did not fit.")
    saved = 1 - chosen.peak_bytes / plain.peak_bytes
    slower = chosen.step_s / plain.step_s if plain.step_s else float("nan")
    return (f"{chosen.name}: peak {format_bytes(chosen.peak_bytes)} ({saved:.0%} below the "
            f"plain run's), "
            f"step time {slower:.2f}x the plain run's, measured here.")


def lever_picker(cluster, config, runs=(), capacity_bytes: int | None = None,
                 interactive: bool = True, checkpointing: bool = True,
                 precision: str = "fp32", accumulation: int = 1):
    """Checkpointing, precision and accumulation controls over real runs (cached; ``runs``
    from ``try_levers`` seed the cache); headless, the Figure for the given choice."""
    picker = LeverPicker(cluster, config, runs)

    def figure(ckpt, prec, acc):
        plain, chosen = picker.run(False, "fp32", 1), picker.run(ckpt, prec, acc)
        return plot_levers([plain, chosen], capacity_bytes)

    if not interactive:
        return figure(checkpointing, precision, accumulation)
    import ipywidgets as widgets

    from labkit.lessons.show.render import slider_panel

    controls = [widgets.Checkbox(value=checkpointing, description="checkpointing"),
                widgets.Dropdown(options=["fp32", "bf16", "mixed"], value=precision,
                                 description="precision"),
                widgets.SelectionSlider(options=[1, 2, 4, 8], value=accumulation,
                                        description="accumulation", continuous_update=False)]
    box = slider_panel(controls, figure, lambda *v: "training", lambda *v: _message(
        picker.run(False, "fp32", 1), picker.run(*v)))
    box.picker = picker
    return box
