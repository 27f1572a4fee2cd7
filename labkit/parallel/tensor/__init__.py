"""Tensor parallelism: each layer's matrices split across devices (Megatron-LM style).

``layers.py`` and ``comm.py`` build it by hand, for teaching; ``dtensor.py`` uses PyTorch's
DTensor, which training runs by default. ``TrainConfig(tp_kind="naive")`` trains with the
hand-written layers instead (``apply.py``). ``tests/test_tensor_parallel.py`` shows both equal
the plain layers, ``tests/test_tensor_parallel_naive.py`` that both train to one device's
losses. The lesson's
experiments are in ``labkit.lessons.tensor_parallel``.
"""

from labkit.parallel.tensor.comm import copy_to_parallel_region, reduce_from_parallel_region
from labkit.parallel.tensor.dtensor import mlp_plan, tensor_parallel_mlp
from labkit.parallel.tensor.layers import ColumnParallelLinear, RowParallelLinear, parallel_mlp

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_parallel_region", "mlp_plan",
           "parallel_mlp", "reduce_from_parallel_region", "tensor_parallel_mlp"]
