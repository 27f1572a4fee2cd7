"""Notebook 07 (composed layouts): the rank grid, the layout explorer, the mesh exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
