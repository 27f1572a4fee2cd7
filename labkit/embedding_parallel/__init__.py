"""Embedding parallelism: a recommender's tables spread over devices, its MLPs data parallel.

Recommendation models are mostly embedding tables: much memory, little compute. Two ways to
split them, both trained by the shared loop and equal to one device:

* table-wise (``strategy="table_wise"``): whole tables placed on ranks by a planner
  (``planner.py``), rows exchanged with an all-to-all (``comm.py``);
* row-wise (``strategy="row_wise"``): every table's rows split over all ranks with DTensor.

``sharded_dlrm.py`` is the model each rank holds (``row_sharded.py`` its row-split tables),
``strategy.py`` builds and measures it, ``sizing.py`` says what a config costs and plans it,
``evaluate.py`` computes held-out AUC, ``results.py`` reads the reports.
"""

from labkit.embedding_parallel.evaluate import evaluate_on_ranks, held_out_auc, held_out_batch
from labkit.embedding_parallel.planner import PlanError, TablePlan, plan_tables
from labkit.embedding_parallel.results import (
    auc_curve,
    collectives,
    memory_by_part,
    merged_weights,
    speed_summary,
    time_split,
)
from labkit.embedding_parallel.sharded_dlrm import ShardedDLRM
from labkit.embedding_parallel.sizing import ModelParts, dlrm_plan, model_parts, training_bytes
from labkit.embedding_parallel.strategy import RowWiseStrategy, TableWiseStrategy

__all__ = ["ModelParts", "PlanError", "RowWiseStrategy", "ShardedDLRM", "TablePlan",
           "TableWiseStrategy", "auc_curve", "collectives", "dlrm_plan", "evaluate_on_ranks",
           "held_out_auc", "held_out_batch", "memory_by_part", "merged_weights", "model_parts",
           "plan_tables", "speed_summary", "time_split", "training_bytes"]
