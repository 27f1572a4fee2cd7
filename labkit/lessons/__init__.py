"""What the notebooks show, one folder per lesson: its experiments, plots, widgets and the
check of its exercise. ``show/`` and ``exercise/`` are shared by every lesson; ``plots.py``,
``widgets.py`` and ``check.py`` gather each lesson's under the names the notebooks use
(``labkit.plots``, ``labkit.widgets``, ``labkit.check``).
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
