"""Notebook 05 (sharded data parallelism): DDP, ZeRO-1 and FSDP side by side, the explorer, the
ZeRO-1 exercise and the FSDP2 exercise (``fully_shard`` on a GPT).
"""

from labkit.runtime.lazy import submodules

__getattr__ = submodules(__name__)
