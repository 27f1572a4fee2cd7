"""Search the layouts of a cluster: every one that fits, fastest first, and why each other
one was refused.

The enumeration covers each field of ``labkit.Layout`` that splits ranks (``MESH_ORDER``:
pp, dp, fsdp, tp, and any dimension added later is left at 1 here), with the levers of a
``TrainConfig``: micro-batches, precision, activation checkpointing. Degrees are every
divisor of the cluster (pp 12 on 384 GPUs); tp divides a node and stays inside it. Each
candidate is projected with the counted, per-block-scaled costs (``project.step_costs``,
cached per layout), so a 70B decoder on 1024 GPUs is searched in seconds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from dataclasses import dataclass, field

from labkit.plan.cluster import Cluster
from labkit.plan.counts import is_recommender
from labkit.plan.parallelism import Parallelism
from labkit.plan.project import Projection, _time, step_costs
from labkit.plan.rules import PlanError, check_layout, check_lever
from labkit.plan.step import Lever


@dataclass
class SearchResult:
    """Layouts that fit, fastest first (pure-bf16 ones after all others: ``caveats``), and
    each refusal with its reason."""

    fits: list[Projection]
    rejected: list[tuple[str, str]] = field(default_factory=list)
    seconds: float = 0.0
    leanest: Projection | None = None  # the refused layout that needed the least memory

    @property
    def best(self) -> Projection:
        if not self.fits:
            raise PlanError(self._why_nothing())
        return self.fits[0]

    def _why_nothing(self) -> str:
        """Which constraint left no layout: each refusal's kind, counted."""
        kinds = Counter(reason.split(":")[0] for _, reason in self.rejected)
        tally = "; ".join(f"{n} x {kind}" for kind, n in kinds.most_common(5))
        lean = ""
        if self.leanest is not None:
            p = self.leanest
            ckpt = " with activation checkpointing" if p.lever.activation_checkpointing else ""
            lean = (f" (the leanest, {p.layout} {p.lever.precision}{ckpt}, needs "
                    f"{p.peak_bytes / 1e9:.1f} GB per GPU of "
                    f"{p.cluster.gpu.usable_memory_bytes / 1e9:.1f} GB usable)")
        if self.leanest is not None:
            verdict = ("memory left nothing: every layout the rules allow is out of memory"
                       + lean + ". Add GPUs or nodes, a GPU with more memory, activation "
                       "checkpointing, or a smaller batch")
        elif not self.rejected:
            verdict = "no candidate layout at all: the cluster has no GPUs to split"
        else:
            verdict = ("the layout rules left nothing (no candidate reached the memory "
                       "check): change the batch, the cluster's size or the model's heads")
        return f"no layout fits this cluster: {verdict}. Refusals: {tally}"

    def table(self, top: int = 10) -> list[dict]:
        return [p.summary() for p in self.fits[:top]]


def _divisors(limit: int) -> list[int]:
    """Every degree that divides ``limit`` (pp 12 on 384 GPUs, 35 on 280), smallest first."""
    return [d for d in range(1, limit + 1) if limit % d == 0]


def _data_splits(data: int, per_node: int) -> list[tuple[int, int]]:
    """(dp, fsdp): plain replicas, FSDP over all, HSDP sharded inside a node."""
    out = {(data, 1), (1, data)}
    if 1 < per_node < data and data % per_node == 0:
        out.add((data // per_node, per_node))
    return sorted(out)


def candidates(model_config, cluster: Cluster, global_batch: int,
               precisions=("bf16", "mixed"), checkpointing=(False, True), cp=(1,),
               optimizer: str | None = None):
    """Every (layout, lever) the search tries: tp x pp x data layouts; with ``cp`` degrees
    above 1, ring-attention layouts (dp or fsdp x cp); for a mixture of experts, experts over
    the dp ranks (ep = dp). ``optimizer``: None is the family's usual one (Adam; SGD for a
    recommender, whose tables production trains with plain or sparse SGD)."""
    world, heads_limit = cluster.world_size, cluster.gpus_per_node
    if is_recommender(model_config):
        yield from _recommender_candidates(cluster, global_batch, precisions,
                                           optimizer or "sgd")
        return
    optimizer = optimizer or "adam"
    yield from _cp_ep_candidates(model_config, cluster, global_batch, precisions,
                                 checkpointing, cp, optimizer)
    layers = getattr(model_config, "n_layers", 1)
    for tp in _divisors(min(world, heads_limit)):
        if world % tp:
            continue
        for pp in _divisors(world // tp):
            if pp > layers:
                continue
            data = world // tp // pp
            per_node = max(1, cluster.gpus_per_node // tp)
            for dp, fsdp in _data_splits(data, per_node):
                for micro in _micro_batches(global_batch, dp * fsdp, pp):
                    for precision in precisions:
                        for ckpt in checkpointing:
                            layout = Parallelism.of(dp=dp, fsdp=fsdp, tp=tp, pp=pp,
                                            schedule="1f1b" if pp > 1 else None,
                                            dp_kind="fsdp" if fsdp > 1 else None)
                            yield layout, Lever(global_batch, micro, precision, ckpt,
                                                optimizer)


def _cp_ep_candidates(model_config, cluster, global_batch, precisions, checkpointing, cp,
                      optimizer: str = "adam"):
    """Layouts with cp > 1 (with dp or fsdp, and fsdp x tp) and, for a mixture of experts,
    ep = dp."""
    from labkit.plan.cp_ep import is_moe

    world, levers = cluster.world_size, [(p, c) for p in precisions for c in checkpointing]
    layouts = [Parallelism.of(dp=world // c, fsdp=1, cp=c) for c in cp
               if c > 1 and world % c == 0]
    layouts += [Parallelism.of(fsdp=world // c, cp=c, dp_kind="fsdp") for c in cp
                if c > 1 and world % c == 0 and world > c]
    for c in (c for c in cp if c > 1):  # tp inside a node, cp and fsdp over the rest
        for tp in _divisors(min(world, cluster.gpus_per_node))[1:]:
            if world % (c * tp) == 0:
                rest = world // (c * tp)
                layouts.append(Parallelism.of(fsdp=rest, cp=c, tp=tp, dp_kind="fsdp")
                               if rest > 1 else Parallelism.of(cp=c, tp=tp))
    if is_moe(model_config) and world > 1:
        layouts.append(Parallelism.of(dp=world, ep=world))
    for layout in layouts:
        for micro in _micro_batches(global_batch, layout.data_size, 1):
            for precision, ckpt in levers:
                yield layout, Lever(global_batch, micro, precision, ckpt, optimizer)


def _recommender_candidates(cluster: Cluster, global_batch: int, precisions,
                            optimizer: str = "sgd"):
    """A recommender's layouts: replicas, FSDP, and tables placed whole or split by rows over
    all GPUs or inside each node (replicated across nodes: the hybrid used in production)."""
    world, node = cluster.world_size, cluster.gpus_per_node
    layouts = [Parallelism.of(dp=world, dp_kind="ddp"), Parallelism.of(fsdp=world, dp_kind="fsdp")]
    for tables in ("table_wise", "row_wise"):
        layouts.append(Parallelism.of(fsdp=world, tables=tables))
        if 1 < node < world:
            layouts.append(Parallelism.of(dp=world // node, fsdp=node, tables=tables))
    for layout in layouts:
        for precision in precisions:
            yield layout, Lever(global_batch, 1, precision, False, optimizer)


def _micro_batches(global_batch: int, data: int, pp: int) -> list[int]:
    per_rank = global_batch // data if global_batch >= data else 0
    if per_rank == 0:
        return [1]
    if pp == 1:
        return [m for m in (1, 2, 4, 8, 16) if per_rank % m == 0]
    return [m for m in (pp, 2 * pp, 4 * pp, 8 * pp) if m <= per_rank and per_rank % m == 0] \
        or [pp]


def search(model_config, cluster: Cluster, global_batch: int, precisions=None,
           checkpointing=(False, True), cp=(1,), optimizer: str | None = None
           ) -> SearchResult:
    """Project every candidate layout; return those that fit, fastest first. ``cp``: the
    context-parallel degrees to try besides 1 (long sequences), e.g. (1, 2, 4, 8).
    ``optimizer`` ("adam", "adamw", "sgd"): None is Adam (SGD for a recommender)."""
    from labkit.plan.rules import warn_tokens_as_batch

    warn_tokens_as_batch(model_config, global_batch)
    if precisions is None:
        precisions = ("fp32",) if cluster.gpu.measured else ("bf16", "mixed")
    for precision in precisions:  # refuse a bad batch once, not once per candidate
        check_lever(Lever(global_batch, 1, precision, optimizer=optimizer or "adam"))
    start = time.perf_counter()
    fits, rejected, leanest = [], [], None
    measured = cluster.gpu.measured
    for layout, lever in candidates(model_config, cluster, global_batch, precisions,
                                    checkpointing, cp, optimizer):
        lever = dataclasses.replace(lever, flash_attention=not measured)
        label = (f"{layout} m={lever.micro_batches} {lever.precision}"
                 f"{' ckpt' if lever.activation_checkpointing else ''}")
        try:
            check_layout(model_config, layout, cluster, lever)
        except PlanError as error:
            rejected.append((label, str(error)))
            continue
        costs = step_costs(model_config, layout, lever, measured, not measured)
        projection = _time(model_config, layout, cluster, lever, costs)
        if not projection.fits:
            rejected.append((label, _overflow(projection)))
            if leanest is None or projection.peak_bytes < leanest.peak_bytes:
                leanest = projection
            continue
        fits.append(projection)
    # pure bf16 (no fp32 master state) last whatever its speed: it may not converge
    fits.sort(key=lambda p: (bool(p.caveats), p.step_s))
    return SearchResult(fits, rejected, time.perf_counter() - start, leanest)


def _overflow(projection: Projection) -> str:
    memory = projection.costs.memory
    largest = max(memory, key=memory.get)
    return (f"out of memory: {projection.peak_bytes / 1e9:.1f} GB per GPU > "
            f"{projection.cluster.gpu.usable_memory_bytes / 1e9:.1f} GB usable ({largest} "
            f"{memory[largest] / 1e9:.1f} GB is the largest part)")
