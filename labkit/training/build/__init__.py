"""Building a run's model on each rank: the layout's parallelisms applied in a fixed order
(``build.py``), with one allocator for every layout (``materialize.py``)."""

from labkit.training.build.build import Built, build
from labkit.training.build.context import ParallelContext, parallel_context
from labkit.training.build.materialize import full_weights, host_shard, materialize

__all__ = ["Built", "ParallelContext", "build", "full_weights", "host_shard", "materialize",
           "parallel_context"]
