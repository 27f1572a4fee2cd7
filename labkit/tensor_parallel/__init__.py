"""Tensor parallelism: each layer's matrices split across devices (Megatron-LM style).

``layers.py`` and ``comm.py`` build it by hand, for teaching; ``dtensor.py`` uses PyTorch's
DTensor. ``tests/test_tensor_parallel.py`` shows both equal the plain layers. ``demo.py``
splits one small matrix multiply both ways; ``per_layer.py`` counts and times each split
layer's collectives; ``tradeoffs.py`` measures TP's traffic beside DDP's.
"""

from labkit.tensor_parallel.comm import copy_to_parallel_region, reduce_from_parallel_region
from labkit.tensor_parallel.demo import SplitMatmul, split_matmul
from labkit.tensor_parallel.dtensor import mlp_plan, tensor_parallel_mlp
from labkit.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, parallel_mlp
from labkit.tensor_parallel.per_layer import LayerComm, comm_per_layer
from labkit.tensor_parallel.tradeoffs import TPvsDDP, check_tp_degree, compare_with_ddp

__all__ = ["ColumnParallelLinear", "LayerComm", "RowParallelLinear", "SplitMatmul", "TPvsDDP",
           "check_tp_degree", "comm_per_layer", "compare_with_ddp", "copy_to_parallel_region",
           "mlp_plan", "parallel_mlp", "reduce_from_parallel_region", "split_matmul",
           "tensor_parallel_mlp"]
