"""The interface every parallel strategy implements, and the registry of strategies.

A strategy decides three things in the shared training loop (``loop.py``): how the model is
wrapped, which slice of the global batch a rank trains on, and what communication happens
between backward and the optimizer step. Measurement stays in the loop, shared by all.
"""

from __future__ import annotations

from torch import nn

from labkit.comm.meter import CommMeter
from labkit.models import build_model


class Strategy:
    """One device, no communication: the baseline every other strategy is compared with."""

    name = "single"
    shards_batch = False  # data-parallel strategies train on a slice of the global batch
    overlaps_comm = False  # communication runs inside backward (DDP) rather than after it
    estimable = True  # estimate_memory knows this strategy
    counts_collectives = False  # the loop records every collective of a step (comm/intercept.py)
    sharded = False  # model state split over ranks: estimate_memory traces it on a fake group

    def check(self, world_size: int, global_batch: int, micro_batches: int = 1) -> None:
        """Raise ValueError, before any process starts, if this cannot run as asked."""
        if global_batch % micro_batches:
            raise ValueError(f"global_batch {global_batch} does not split into "
                             f"{micro_batches} micro-batches: choose a multiple")
        if world_size != 1:
            raise ValueError(f"strategy 'single' trains on one device, not {world_size}: use "
                             "labkit.Cluster(1) or a data-parallel strategy such as 'ddp'")

    def check_model(self, model_config, world_size: int = 1) -> None:
        """Raise ValueError, before any process starts, for a model this cannot train on
        ``world_size`` ranks."""

    def build(self, ctx, config) -> nn.Module:
        """The model (or this rank's part of it) on the device."""
        from labkit.train.step import weight_dtype

        return build_model(config.model, ctx.device, config.seed, weight_dtype(config.precision))

    def wrap(self, ctx, model: nn.Module, meter: CommMeter, config) -> nn.Module:
        return model

    def make_optimizer(self, model: nn.Module, config):
        from labkit.train.step import make_optimizer

        return make_optimizer(config.optimizer, model.parameters(), config.lr)

    def step(self, ctx, model, batch, optimizer, config, synchronize) -> dict | None:
        """A whole training step of the strategy's own, or None for the shared one."""
        return None

    def sync_gradients(self, ctx, model: nn.Module, meter: CommMeter) -> None:
        """Called after backward, before the optimizer step."""

    def no_sync(self, model: nn.Module):
        """A context that skips gradient communication (accumulating micro-batches), or None."""
        return None

    def step_extras(self, ctx, model: nn.Module) -> dict:
        """Measurements of the last step that only this strategy knows (added to its record)."""
        return {}


class DataParallelBase(Strategy):
    shards_batch = True

    def check(self, world_size: int, global_batch: int, micro_batches: int = 1) -> None:
        if global_batch % (world_size * micro_batches):
            raise ValueError(f"global_batch {global_batch} does not split evenly over "
                             f"{world_size} ranks x {micro_batches} micro-batches: choose a "
                             f"multiple of {world_size * micro_batches}")


# name -> (module, class, arguments): imported on first use, so that each parallelism's
# package loads only when it is asked for.
_REGISTRY = {
    "single": ("labkit.train.strategy", "Strategy", ()),
    "naive_dp": ("labkit.data_parallel", "NaiveDataParallel", ()),
    "ddp": ("labkit.data_parallel", "DDPStrategy", ()),
    "zero1": ("labkit.sharded_data_parallel", "Zero1Strategy", ()),
    "fsdp": ("labkit.sharded_data_parallel", "FSDPStrategy", ()),
    "naive_pipeline": ("labkit.pipeline_parallel.strategy", "PipelineStrategy",
                       ("naive_pipeline",)),
    "gpipe": ("labkit.pipeline_parallel.strategy", "PipelineStrategy", ("gpipe",)),
    "1f1b": ("labkit.pipeline_parallel.strategy", "PipelineStrategy", ("1f1b",)),
    "interleaved_1f1b": ("labkit.pipeline_parallel.strategy", "PipelineStrategy",
                         ("interleaved_1f1b",)),
    "tp": ("labkit.tensor_parallel.strategy", "TensorParallelStrategy", ()),
    "table_wise": ("labkit.embedding_parallel", "TableWiseStrategy", ()),
    "row_wise": ("labkit.embedding_parallel", "RowWiseStrategy", ()),
    "row_wise_dtensor": ("labkit.embedding_parallel", "RowWiseStrategy", ("dtensor",)),
}
STRATEGIES = tuple(_REGISTRY)


def strategy_for(name: str) -> Strategy:
    import importlib

    if name not in _REGISTRY:
        raise ValueError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGIES)}")
    module, cls, args = _REGISTRY[name]
    return getattr(importlib.import_module(module), cls)(*args)


def local_slice(global_batch_value, rank: int, world_size: int):
    """Rank ``rank``'s equal share of a batch (a tensor or a tuple of tensors)."""
    if isinstance(global_batch_value, tuple):
        return tuple(local_slice(v, rank, world_size) for v in global_batch_value)
    share = global_batch_value.shape[0] // world_size
    return global_batch_value[rank * share:(rank + 1) * share]
