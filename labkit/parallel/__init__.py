"""The parallelisms, one folder per dimension: ``data``, ``sharded``, ``tensor``, ``pipeline``,
``context``, ``expert`` and ``embedding``. Each holds the wiring of PyTorch's engine for that
dimension and, where the lessons teach it, a hand-written version beside it. Imports the
runtime and the models only.
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
