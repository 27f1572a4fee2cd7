"""One training step: the step without a pipeline (``spmd.py``; a pipeline's is in
``labkit/parallel/pipeline/schedule.py``) and the one record both produce (``record.py``)."""

from labkit.training.step.record import StepRecord
from labkit.training.step.spmd import run_step, split_batch

__all__ = ["StepRecord", "run_step", "split_batch"]
