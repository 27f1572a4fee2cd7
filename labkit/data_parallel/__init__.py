"""Data parallelism: a model copy per device, gradients averaged by AllReduce."""

from labkit.data_parallel.ddp import DDPStrategy
from labkit.data_parallel.naive import NaiveDataParallel, average_gradients

__all__ = ["DDPStrategy", "NaiveDataParallel", "average_gradients"]
