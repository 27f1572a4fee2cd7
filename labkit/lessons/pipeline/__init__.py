"""Notebook 03 (pipeline parallelism): the Gantt explorer and the micro-batch exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
