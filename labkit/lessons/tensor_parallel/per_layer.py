"""Tensor parallelism's communication, layer by layer: which split layer issues which
collective, in the forward or the backward pass, how many bytes, for how long.

A training record says how many collectives a step issued; this says where. One forward and
backward of the ``tp`` strategy's model (built by the training path, ``labkit/training/build``)
runs under ``runtime/comm/intercept.py``'s CollectiveMeter (the same meter and clock training uses:
device time on GPUs), and hooks on the split layers name the layer each collective belongs to:

* forward: from a layer's forward pre-hook to its forward hook, registered around DTensor's
  own hooks, so the row-wise layer's output AllReduce counts as that layer's;
* backward: from the moment the gradient of a layer's output is ready to the moment the
  gradient of its input is, so the column-wise layer's input-gradient AllReduce counts as
  that layer's.

    layers = comm_per_layer(cluster, TrainConfig(model="mlp", strategy="tp"))
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from labkit.lessons.tensor_parallel.tradeoffs import check_tp_degree
from labkit.models import loss_fn, make_batch, plan_for, to_device
from labkit.runtime.comm.intercept import CollectiveMeter
from labkit.runtime.comm.meter import CommMeter
from labkit.runtime.memory.capacity import on_host
from labkit.training.build import build, parallel_context
from labkit.training.config import TrainConfig
from labkit.training.run import Run, resolve

OUTSIDE = "(between split layers)"


class _LayerMeter(CommMeter):
    """The step's meter, with each collective filed (its ``tag``) under the layer and pass
    that were running when it completed."""

    def __init__(self, clock, label):
        super().__init__(clock, label)
        self.tag = (OUTSIDE, "forward")
        self.shapes: dict[tuple[str, str], list[int]] = {}  # (layer, pass) -> tensor shape

    def at(self, layer: str, phase: str):
        def mark(*_):
            self.tag = (layer, phase)
        return mark


def _hook_layers(model: torch.nn.Module, names: list[str], meter: _LayerMeter) -> list:
    """Forward and backward boundaries of every split layer; returns the hook handles."""
    handles = []
    for name in names:
        def before(module, args, name=name):
            meter.at(name, "forward")()
            x = args[0]  # (batch, [seq,] in_features), whole on every rank or this rank's slice
            meter.shapes[(name, "backward")] = list(x.shape)  # what its gradient AllReduce moves
            if x.requires_grad:  # its gradient ready = this layer's backward is over
                x.register_hook(meter.at(OUTSIDE, "backward"))

        def after(module, args, output, name=name):
            meter.at(OUTSIDE, "forward")()
            meter.shapes[(name, "forward")] = list(output.shape)  # what its AllReduce moves
            if output.requires_grad:  # its gradient ready = this layer's backward begins
                output.register_hook(meter.at(name, "backward"))

        module = model.get_submodule(name)
        handles += [module.register_forward_pre_hook(before, prepend=True),
                    module.register_forward_hook(after)]  # after DTensor's output hook
    return handles


def _layer_comm_on_rank(ctx, run_dict: dict) -> list[dict]:
    run = parallel_context(ctx, Run.from_dict(run_dict))
    config = run.config
    model = build(run).model
    with on_host():
        inputs, targets = make_batch(config.model, 0, config.global_batch, config.seed)
    inputs, targets = to_device((inputs, targets), ctx.device)
    loss = loss_fn(config.model)
    loss(model(inputs), targets).backward()  # warm-up: the first collectives set up links
    meter = _LayerMeter(run.clock, run.labels)
    handles = _hook_layers(model, list(plan_for(config.model).tp_styles(model)), meter)
    try:
        with CollectiveMeter(meter):  # settles on leaving
            loss(model(inputs), targets).backward()
    finally:
        for handle in handles:
            handle.remove()
    return [{"layer": layer, "phase": phase, "kind": kind, "bytes": nbytes,
             "seconds": end - start, "shape": meter.shapes.get((layer, phase))}
            for _, kind, nbytes, _, start, end, (layer, phase) in meter.entries]


@dataclass
class LayerComm:
    """Collectives of one forward and backward, per split layer (rank 0's; every rank issues
    the same ones). ``rows``: {"layer", "phase", "kind", "shape", "calls", "bytes",
    "seconds"}, ``shape`` being the activation (or its gradient) the collective carries."""

    world_size: int
    global_batch: int
    rows: list[dict]

    def total(self, key: str = "bytes") -> float:
        return sum(row[key] for row in self.rows)

    def calls(self, phase: str) -> int:
        return sum(row["calls"] for row in self.rows if row["phase"] == phase)

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{h}</th>" for h in ("layer", "pass", "collective", "calls",
                                                 "tensor (shape)", "bytes", "time in it"))
        body = "".join(f"<tr><td>{r['layer']}</td><td>{r['phase']}</td><td>{r['kind']}</td>"
                       f"<td>{r['calls']}</td><td>{_shape(r)}</td><td>{r['bytes']:,}</td>"
                       f"<td>{r['seconds'] * 1e3:.2f} ms</td></tr>" for r in self.rows)
        return (f"<b>collectives of one training step, per split layer: {self.world_size} "
                f"ranks, batch {self.global_batch}, measured here</b>"
                f"<table><tr>{head}</tr>{body}</table>")


def _shape(row: dict) -> str:
    """The activation a layer's collective carries: its output forward, the gradient of its
    input backward."""
    what = "output" if row["phase"] == "forward" else "input gradient"
    return f"{what} {tuple(row['shape'])}" if row["shape"] else ""


def _grouped(rows: list[dict]) -> list[dict]:
    """One row per (layer, pass, kind), in the order they first ran."""
    grouped: dict[tuple, dict] = {}
    for row in rows:
        key = (row["layer"], row["phase"], row["kind"])
        entry = grouped.setdefault(key, {"layer": key[0], "phase": key[1], "kind": key[2],
                                         "shape": row["shape"], "calls": 0, "bytes": 0,
                                         "seconds": 0.0})
        entry["calls"] += 1
        entry["bytes"] += row["bytes"]
        entry["seconds"] += row["seconds"]
    return list(grouped.values())


def comm_per_layer(cluster, config: TrainConfig | None = None, **fields) -> LayerComm:
    """Count and time the collectives of one ``tp`` training step per split layer, on every
    rank of ``cluster``. ``fields`` are TrainConfig's (model, global_batch, seed...)."""
    config = (config or TrainConfig()).replace(strategy="tp", **fields)
    check_tp_degree(config.model, cluster.world_size)
    run = resolve(config, cluster.world_size, cluster.device, cluster.backend)
    ranks = cluster.run(_layer_comm_on_rank, run.to_dict())
    return LayerComm(cluster.world_size, config.global_batch, _grouped(ranks[0]))
