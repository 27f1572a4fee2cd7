"""Tensor parallelism as a training strategy ("tp"): every linear pair of the zoo's MLP, and
each GPT block's attention (by heads) and MLP, split over all ranks with DTensor.

Each rank builds the model on the meta device (no memory), shards it, and only then
allocates its shards and copies their values from a model the host assembled: a model whose
weights do not fit one device can be trained.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

from labkit.memory.capacity import on_host
from labkit.models import GPT, MLP, build_model
from labkit.tensor_parallel.dtensor import mlp_plan
from labkit.train.shards import allocate_shards
from labkit.train.step import weight_dtype
from labkit.train.strategy import Strategy


def tp_plan(model: nn.Module) -> dict:
    """Column-wise then row-wise, for every pair of layers that can be split."""
    if isinstance(model, MLP):
        return {f"layers.{name}": style for name, style in mlp_plan(model.layers).items()}
    if isinstance(model, GPT):
        plan = {}
        for i in range(len(model.blocks)):
            plan.update({f"blocks.{i}.attn.qkv": ColwiseParallel(),
                         f"blocks.{i}.attn.proj": RowwiseParallel(),
                         f"blocks.{i}.mlp.0": ColwiseParallel(),
                         f"blocks.{i}.mlp.2": RowwiseParallel()})
        return plan
    raise ValueError(f"tensor parallelism here splits the zoo's 'mlp' and 'gpt', not "
                     f"{type(model).__name__}")


def group_heads(model: nn.Module, world_size: int) -> None:
    """Reorder each attention's qkv rows from [q; k; v] to [q_0 k_0 v_0; q_1 k_1 v_1; ...] so
    that a column-wise split gives rank r the q, k and v of its own heads."""
    if not isinstance(model, GPT):
        return
    for block in model.blocks:
        qkv = block.attn.qkv
        d_model = qkv.weight.shape[1]
        if d_model % world_size or (d_model // block.attn.d_head) % world_size:
            raise ValueError(f"{d_model // block.attn.d_head} heads do not split over "
                             f"{world_size} ranks")
        order = torch.arange(3 * d_model).view(3, world_size, -1).transpose(0, 1).reshape(-1)
        with torch.no_grad():
            qkv.weight.copy_(qkv.weight[order])
            qkv.bias.copy_(qkv.bias[order])


class TensorParallelStrategy(Strategy):
    name = "tp"
    estimable = False  # estimate_memory does not trace DTensor shards yet
    counts_collectives = True  # DTensor's AllReduces, forward and backward, in every layer

    def check(self, world_size: int, global_batch: int, micro_batches: int = 1) -> None:
        if global_batch % micro_batches:  # every rank sees the whole batch
            raise ValueError(f"global_batch {global_batch} does not split into "
                             f"{micro_batches} micro-batches: choose a multiple")

    def check_model(self, model_config, world_size: int = 1) -> None:
        from labkit.tensor_parallel.tradeoffs import check_tp_degree

        check_tp_degree(model_config, world_size)  # an even split of widths and heads

    def build(self, ctx, config) -> nn.Module:
        dtype = weight_dtype(config.precision)
        with on_host():
            host = build_model(config.model, "cpu", config.seed, dtype)
            group_heads(host, ctx.world_size)
            values = dict(host.named_parameters())
        model = build_model(config.model, "meta", config.seed, dtype)
        with on_host():  # the mesh's rank map is a host tensor, not device memory
            mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
        parallelize_module(model, mesh, tp_plan(model))
        allocate_shards(model, values, ctx.rank, ctx.world_size, ctx.device)
        return model
