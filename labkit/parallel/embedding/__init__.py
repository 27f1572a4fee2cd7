"""Embedding parallelism: a recommender's tables spread over devices, its MLPs data parallel.

Recommendation models are mostly embedding tables: much memory, little compute. Two ways to
split them over a group of ranks (a layout's fsdp dimension), both trained by the shared loop
and equal to one device:

* table-wise (``strategy="table_wise"``, or ``layout=Layout(fsdp=N), tables="table_wise"``): whole
  tables placed on ranks by a planner (``placement.py``), rows exchanged with an all-to-all
  (``comm.py``);
* row-wise (``strategy="row_wise"``): every table's rows split over the group's ranks.

With ``layout=Layout(dp=2, fsdp=2), tables=...`` the tables are sharded inside each group of two and
replicated across the two groups (the hybrid used in production). ``sharded_dlrm.py`` is the
model each rank holds (``row_sharded.py`` its row-split tables), ``tables.py`` places and
synchronises them, ``observe.py`` measures lookups, bytes by part and AUC, ``sizing.py`` says
what a config costs and plans it, ``evaluate.py`` computes held-out AUC, ``results.py`` reads
the reports.
"""

from labkit.parallel.embedding.evaluate import evaluate_on_ranks, held_out_auc, held_out_batch
from labkit.parallel.embedding.observe import TableObserver
from labkit.parallel.embedding.placement import PlacementError, TablePlan, plan_tables
from labkit.parallel.embedding.results import (
    auc_curve,
    collectives,
    memory_by_part,
    merged_weights,
    speed_summary,
    time_split,
)
from labkit.parallel.embedding.sharded_dlrm import ShardedDLRM
from labkit.parallel.embedding.sizing import ModelParts, dlrm_plan, model_parts, training_bytes
from labkit.parallel.embedding.tables import shard_tables, sync_table_gradients, table_plan

__all__ = ["ModelParts", "PlacementError", "ShardedDLRM", "TableObserver", "TablePlan", "auc_curve",
           "collectives", "dlrm_plan", "evaluate_on_ranks", "held_out_auc", "held_out_batch",
           "memory_by_part", "merged_weights", "model_parts", "plan_tables", "shard_tables",
           "speed_summary", "sync_table_gradients", "table_plan", "time_split",
           "training_bytes"]
