"""Checks for the notebooks' exercises: each runs the learner's code on the ranks and says
precisely what is right or wrong (values, bytes on the wire, memory per rank, collectives).

    result = labkit.check.ring_all_reduce(cluster, ring_all_reduce)   # a CheckResult

A check never raises for the learner's mistakes and never hangs: a function that raises, is
not written yet or hangs (stopped after ``timeout`` seconds; the cluster restarts its ranks)
becomes the verdict.
"""

from labkit.lessons.all_reduce.check import ring_all_reduce
from labkit.lessons.data_parallel.check import average_gradients, bucket_hook
from labkit.lessons.exercise.result import MIME_TYPE, CheckResult, ExerciseFailed
from labkit.lessons.layouts.check import mesh_groups
from labkit.lessons.memory_wall.check import predict_memory
from labkit.lessons.pipeline.check import pipeline_step
from labkit.lessons.recommender.check import place_tables
from labkit.lessons.sharding.check import zero1
from labkit.lessons.tensor_parallel.check import tensor_parallel_linears

__all__ = ["MIME_TYPE", "CheckResult", "ExerciseFailed", "average_gradients", "bucket_hook",
           "pipeline_step", "place_tables", "predict_memory", "ring_all_reduce",
           "tensor_parallel_linears", "zero1"]
__all__ += ["mesh_groups"]
from labkit.lessons.long_context.check import merge_attention  # noqa: E402

__all__ += ["merge_attention"]

from labkit.lessons.checkpoints.check import training_state  # noqa: E402

__all__ += ["training_state"]

from labkit.lessons.planning.check import all_reduce_seconds  # noqa: E402

__all__ += ["all_reduce_seconds"]

from labkit.lessons.tensor_parallel.plan_check import tensor_parallel_plan  # noqa: E402

__all__ += ["tensor_parallel_plan"]

from labkit.lessons.sharding.fsdp_check import fully_shard_model  # noqa: E402

__all__ += ["fully_shard_model"]

from labkit.lessons.checkpoints.dcp_check import dcp_resume  # noqa: E402
from labkit.lessons.layouts.compose_check import compose_mesh  # noqa: E402
from labkit.lessons.pipeline.schedule_check import pipeline_schedule  # noqa: E402

__all__ += ["compose_mesh", "dcp_resume", "pipeline_schedule"]

from labkit.lessons.exercise.hints import hint  # noqa: E402
from labkit.lessons.exercise.solutions import reveal  # noqa: E402

__all__ += ["hint", "reveal"]
