"""What the notebooks show, one folder per lesson: its experiments, plots, widgets and the
check of its exercise. ``show/`` and ``exercise/`` are shared by every lesson; ``plots.py``,
``widgets.py`` and ``check.py`` gather each lesson's under the names the notebooks use
(``labkit.plots``, ``labkit.widgets``, ``labkit.check``).
"""

import sys

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)


def _png(figure) -> bytes:
    from labkit.lessons.show.display import figure_png

    return figure_png(figure)


def _show_figures_in_ipython() -> None:
    """In a kernel, a bare matplotlib ``Figure`` a cell returns renders as a PNG (no pyplot),
    whichever lesson module drew it; registered by name, so matplotlib is not imported here
    (a rank that imports a lesson's check never loads it)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if shell is not None:
        formatter = shell.display_formatter.formatters["image/png"]
        formatter.for_type_by_name("matplotlib.figure", "Figure", _png)


_show_figures_in_ipython()
