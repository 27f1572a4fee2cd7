"""Notebook 01 (the memory wall): the OOM boundary, the memory levers, the prediction exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
