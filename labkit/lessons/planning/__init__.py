"""Notebook 09 (plan a real run): the planner beside measured runs, the AllReduce-time exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
