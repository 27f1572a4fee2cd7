"""How the zoo's DLRM is split: its embedding tables over the fsdp dimension (whole tables by
a planner, or rows; ``labkit/parallel/embedding``), or by FSDP with each table and each MLP
a unit. Its dense part is small and stays data parallel; it is not a chain for a pipeline,
and tensor parallelism does not split it."""

from __future__ import annotations

import math

from torch import nn

from labkit.models.split import ParallelPlan


class DLRMPlan(ParallelPlan):
    family = "dlrm"

    def check_tp(self, config, degree: int) -> None:
        if degree > 1:
            raise ValueError("tensor parallelism here splits the zoo's 'mlp' and 'gpt'; the "
                             "DLRM's tables are split with tables='table_wise' or 'row_wise' "
                             "over fsdp")

    def check_pipeline(self, config, stages: int) -> None:
        raise ValueError("a pipeline cuts a chain of layers: choose the zoo's 'mlp' or 'gpt', "
                         "not 'dlrm' (DLRM's embedding tables are split by sharding instead)")

    def check_tables(self, config, tables: str, group_size: int) -> None:
        if tables.startswith("row_wise"):
            rows = config.rows_per_table
            chunk = math.ceil(rows / group_size)
            if chunk * (group_size - 1) >= rows:
                raise ValueError(f"{rows} rows per table leave the last of {group_size} ranks "
                                 "without any: choose rows_per_table a multiple of the rank "
                                 "count")

    def fsdp_units(self, module: nn.Module) -> list[nn.Module]:
        return [*module.tables, module.bottom, module.top]
