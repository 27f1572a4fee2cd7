"""Notebook 05 (sharded data parallelism): DDP, ZeRO-1 and FSDP side by side, the explorer, the
ZeRO-1 exercise.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
