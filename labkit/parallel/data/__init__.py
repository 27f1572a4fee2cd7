"""Data parallelism: a model copy per device, gradients averaged by AllReduce; by hand
(``naive.py``) and with PyTorch's DDP (``ddp.py``)."""

from labkit.parallel.data.ddp import wrap_ddp
from labkit.parallel.data.naive import average_gradients, broadcast_parameters

__all__ = ["average_gradients", "broadcast_parameters", "wrap_ddp"]
