"""Notebook 02 (data parallelism): scaling sweeps, the batch sweep, DDP's bucket overlap, the
evidence runs behind its quiz, the gradient-averaging exercises.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
