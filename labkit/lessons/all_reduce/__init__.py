"""Notebook 00 (your cluster): the AllReduce and its ring exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
