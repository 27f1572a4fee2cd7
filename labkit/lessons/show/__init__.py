"""Shared by the lessons' plots and widgets: showing figures, the common controls, quizzes, a
function's source, and the values a notebook records for its tests.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
