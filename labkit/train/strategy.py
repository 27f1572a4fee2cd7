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

    def check(self, world_size: int, global_batch: int, micro_batches: int = 1) -> None:
        """Raise ValueError, before any process starts, if this cannot run as asked."""
        if global_batch % micro_batches:
            raise ValueError(f"global_batch {global_batch} does not split into "
                             f"{micro_batches} micro-batches: choose a multiple")
        if world_size != 1:
            raise ValueError(f"strategy 'single' trains on one device, not {world_size}: use "
                             "labkit.Cluster(1) or a data-parallel strategy such as 'ddp'")

    def check_model(self, model_config) -> None:
        """Raise ValueError, before any process starts, for a model this cannot train."""

    def build(self, ctx, config) -> nn.Module:
        """The model (or this rank's part of it) on the device."""
        from labkit.train.step import weight_dtype

        return build_model(config.model, ctx.device, config.seed, weight_dtype(config.precision))

    def wrap(self, ctx, model: nn.Module, meter: CommMeter, config) -> nn.Module:
        return model

    def step(self, ctx, model, batch, optimizer, config, synchronize) -> dict | None:
        """A whole training step of the strategy's own, or None for the shared one."""
        return None

    def sync_gradients(self, ctx, model: nn.Module, meter: CommMeter) -> None:
        """Called after backward, before the optimizer step."""

    def no_sync(self, model: nn.Module):
        """A context that skips gradient communication (accumulating micro-batches), or None."""
        return None


class DataParallelBase(Strategy):
    shards_batch = True

    def check(self, world_size: int, global_batch: int, micro_batches: int = 1) -> None:
        if global_batch % (world_size * micro_batches):
            raise ValueError(f"global_batch {global_batch} does not split evenly over "
                             f"{world_size} ranks x {micro_batches} micro-batches: choose a "
                             f"multiple of {world_size * micro_batches}")


STRATEGIES = ("single", "naive_dp", "ddp", "naive_pipeline", "gpipe", "1f1b", "tp")


def strategy_for(name: str) -> Strategy:
    from labkit.data_parallel import DDPStrategy, NaiveDataParallel
    from labkit.pipeline_parallel.strategy import PipelineStrategy
    from labkit.tensor_parallel.strategy import TensorParallelStrategy

    strategies = {"single": Strategy, "naive_dp": NaiveDataParallel, "ddp": DDPStrategy,
                  "naive_pipeline": lambda: PipelineStrategy("naive_pipeline"),
                  "gpipe": lambda: PipelineStrategy("gpipe"),
                  "1f1b": lambda: PipelineStrategy("1f1b"), "tp": TensorParallelStrategy}
    if name not in STRATEGIES:
        raise ValueError(f"unknown strategy {name!r}: choose one of {', '.join(STRATEGIES)}")
    return strategies[name]()


def local_slice(global_batch_value, rank: int, world_size: int):
    """Rank ``rank``'s equal share of a batch (a tensor or a tuple of tensors)."""
    if isinstance(global_batch_value, tuple):
        return tuple(local_slice(v, rank, world_size) for v in global_batch_value)
    share = global_batch_value.shape[0] // world_size
    return global_batch_value[rank * share:(rank + 1) * share]
