"""Shared by the exercises' checks: what a check found, running a learner's function on the ranks
without hanging, what it sent, hints and reference solutions.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
