"""Show labkit's Figures in Jupyter without pyplot's global figure list."""

from __future__ import annotations

import io

from matplotlib.figure import Figure


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


def register_ipython_display() -> None:
    """Let a bare ``Figure`` returned by a cell render as a PNG (pyplot is never needed)."""
    try:
        from IPython import get_ipython
    except ImportError:
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(Figure, figure_png)
