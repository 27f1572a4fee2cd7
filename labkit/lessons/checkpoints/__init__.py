"""Notebook 10 (when a GPU dies): planted failures, the checkpoint interval, the kill switch,
the projection to a named cluster, the resumption exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
