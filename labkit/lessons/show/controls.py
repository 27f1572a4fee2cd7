"""The controls every notebook uses, made once: same names, ranges and look everywhere."""

from __future__ import annotations

from labkit.runtime.memory.units import format_bytes


def gpu_count_slider(options, value: int | None = None):
    """How many devices (ranks) to use."""
    import ipywidgets as widgets

    options = sorted(options)
    return widgets.SelectionSlider(options=options, value=value or options[-1],
                                   description="GPUs", continuous_update=False)


def model_size_slider(sizes, value: int | None = None):
    """Model size in parameters, labelled in millions."""
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=[(f"{p / 1e6:.2g}M params", p) for p in sizes],
                                   value=value or sizes[0], description="model size",
                                   continuous_update=False, layout={"width": "450px"})


def memory_cap_slider(capacities, value: int | None = None):
    """Each device's memory capacity, in bytes."""
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=[(format_bytes(c), c) for c in capacities],
                                   value=value or capacities[-1], description="memory",
                                   continuous_update=False)


def strategy_picker(strategies=("ddp", "naive_dp"), value: str | None = None):
    """Which parallel strategy trains the model."""
    import ipywidgets as widgets

    return widgets.ToggleButtons(options=list(strategies), value=value or strategies[0],
                                 description="strategy")


def micro_batches_slider(options=(1, 2, 4, 8), value: int | None = None):
    """Micro-batches per step (gradient accumulation, pipeline schedules)."""
    import ipywidgets as widgets

    return widgets.SelectionSlider(options=list(options), value=value or options[0],
                                   description="micro-batches", continuous_update=False)
