"""Checks for the notebooks' exercises: each runs the learner's code on the ranks and says
precisely what is right or wrong (values, bytes on the wire, memory per rank, collectives).

    result = labkit.check.ring_all_reduce(cluster, ring_all_reduce)   # a CheckResult

A check never raises for the learner's mistakes and never hangs: a function that raises, is
not written yet or hangs (stopped after ``timeout`` seconds; the cluster restarts its ranks)
becomes the verdict.
"""

from labkit.check.gradients import average_gradients, bucket_hook
from labkit.check.memory import predict_memory
from labkit.check.mesh import mesh_groups
from labkit.check.pipeline import pipeline_step
from labkit.check.result import MIME_TYPE, CheckResult, ExerciseFailed
from labkit.check.ring import ring_all_reduce
from labkit.check.tables import place_tables
from labkit.check.tensor_parallel import tensor_parallel_linears
from labkit.check.zero import zero1

__all__ = ["MIME_TYPE", "CheckResult", "ExerciseFailed", "average_gradients", "bucket_hook",
           "pipeline_step", "place_tables", "predict_memory", "ring_all_reduce",
           "tensor_parallel_linears", "zero1"]
__all__ += ["mesh_groups"]
from labkit.check.online_softmax import merge_attention  # noqa: E402

__all__ += ["merge_attention"]

from labkit.check.resume import training_state  # noqa: E402

__all__ += ["training_state"]

from labkit.check.comm_time import all_reduce_seconds  # noqa: E402

__all__ += ["all_reduce_seconds"]

from labkit.check.hints import hint  # noqa: E402
from labkit.check.solutions import reveal  # noqa: E402

__all__ += ["hint", "reveal"]
