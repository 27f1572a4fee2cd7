"""Data parallelism: a model copy per device, gradients averaged by AllReduce; by hand
(``naive.py``) and with PyTorch's DDP (``ddp.py``)."""

from labkit.data_parallel.ddp import wrap_ddp
from labkit.data_parallel.naive import average_gradients, broadcast_parameters
from labkit.data_parallel.overlap import BucketTimeline, bucket_timeline

__all__ = ["BucketTimeline", "average_gradients", "broadcast_parameters", "bucket_timeline",
           "wrap_ddp"]
