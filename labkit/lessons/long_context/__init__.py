"""Notebook 08 (long sequences and experts): ring attention's schedule, the sequence explorer,
the capacity factor, the MoE beside the dense model, the online-softmax exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
