"""Sharded data parallelism: ZeRO-1 (optimizer state sharded) and FSDP2 (everything sharded).

Every rank still trains on its own slice of the batch, as in data parallelism, but the model
state is no longer copied N times: ZeRO stage 1 splits the optimizer state over the ranks
(``zero.py``, PyTorch's ``ZeroRedundancyOptimizer``), FSDP2 (ZeRO stage 3) splits the
parameters, gradients and optimizer state and gathers each layer's parameters just before it
runs (``fsdp.py``, PyTorch's ``fully_shard``).
"""

from labkit.sharded_data_parallel.compare import (
    ShardingComparison,
    ShardingRow,
    compare_sharding,
)
from labkit.sharded_data_parallel.fsdp import FSDPStrategy, shard_units
from labkit.sharded_data_parallel.zero import Zero1Strategy, zero1_partition

__all__ = ["FSDPStrategy", "ShardingComparison", "ShardingRow", "Zero1Strategy",
           "compare_sharding", "shard_units", "zero1_partition"]
