"""Sharded data parallelism: ZeRO-1 (optimizer state sharded) and FSDP2 (everything sharded).

Every rank still trains on its own slice of the batch, as in data parallelism, but the model
state is no longer copied N times: ZeRO stage 1 splits the optimizer state over the ranks
(``zero.py``, PyTorch's ``ZeroRedundancyOptimizer``), FSDP2 (ZeRO stage 3) splits the
parameters, gradients and optimizer state and gathers each unit's parameters just before it
runs (``fsdp.py``, PyTorch's ``fully_shard``). ``compare.py`` measures them side by side
(``labkit.compare_sharding``; it trains, so this package's ``__init__`` leaves it out: the
build path imports the engines from here).
"""

from labkit.parallel.sharded.fsdp import apply_fsdp, apply_replicate
from labkit.parallel.sharded.zero import zero1_optimizer, zero1_partition

__all__ = ["apply_fsdp", "apply_replicate", "zero1_optimizer", "zero1_partition"]
