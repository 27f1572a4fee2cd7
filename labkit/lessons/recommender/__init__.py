"""Notebook 06 (a recommender at scale): the explorer, plots and the table-placement exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
