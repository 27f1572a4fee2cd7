"""Tensor parallelism: each layer's matrices split across devices (Megatron-LM style).

``layers.py`` and ``comm.py`` build it by hand, for teaching; ``dtensor.py`` uses PyTorch's
DTensor. ``tests/test_tensor_parallel.py`` shows both equal the plain layers.
"""

from labkit.tensor_parallel.comm import copy_to_parallel_region, reduce_from_parallel_region
from labkit.tensor_parallel.dtensor import mlp_plan, tensor_parallel_mlp
from labkit.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, parallel_mlp

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_parallel_region", "mlp_plan",
           "parallel_mlp", "reduce_from_parallel_region", "tensor_parallel_mlp"]
