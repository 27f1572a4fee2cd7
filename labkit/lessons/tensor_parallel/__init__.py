"""Notebook 04 (tensor parallelism): one matrix multiply split two ways, each split layer's
collectives, TP's traffic beside DDP's, the explorer, the column/row-parallel exercise and
the plan exercise (a GPT block for ``parallelize_module``).
"""

from labkit.lessons.tensor_parallel.demo import SplitMatmul, split_matmul
from labkit.lessons.tensor_parallel.per_layer import LayerComm, comm_per_layer
from labkit.lessons.tensor_parallel.plan_check import gpt_block
from labkit.lessons.tensor_parallel.tradeoffs import TPvsDDP, check_tp_degree, compare_with_ddp

__all__ = ["LayerComm", "SplitMatmul", "TPvsDDP", "check_tp_degree", "comm_per_layer",
           "compare_with_ddp", "gpt_block", "split_matmul"]
