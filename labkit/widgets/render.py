"""Put a Figure into an ipywidgets Output, in a live kernel and in plain Python alike."""

from __future__ import annotations

from matplotlib.figure import Figure

from labkit.plots.display import figure_png


def show_figure(output, fig: Figure) -> None:
    """Replace ``output``'s content by ``fig`` as a PNG. Assigning outputs (rather than
    ``with output:``) works without a kernel too, so widget callbacks are testable."""
    from IPython.display import Image

    output.outputs = ()
    output.append_display_data(Image(figure_png(fig)))
