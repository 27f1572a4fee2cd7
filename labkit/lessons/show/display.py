"""A Figure as PNG bytes (``labkit/lessons/__init__.py`` makes Jupyter show bare Figures with it:
no pyplot, no global figure list)."""

from __future__ import annotations

import io

from matplotlib.figure import Figure


def figure_png(fig: Figure, dpi: int = 100) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()
