"""The step and ``main`` of a written script."""

from __future__ import annotations

import json
import re

from labkit.training.script.model import MODEL_CLASS
from labkit.training.script.source import Piece


def _autocast(run, engine) -> bool:
    """Mixed precision by autocast, where FSDP2's policy does not cast already."""
    return run.config.precision == "mixed" and engine != "fsdp"


def _forward(indent: str, autocast: bool, loss_fn: str, scale: str = "") -> list[str]:
    expr = f"loss = {loss_fn}(model(inputs), targets){scale}"
    if not autocast:
        return [indent + expr]
    return [f"{indent}with torch.autocast(inputs.device.type, dtype=torch.bfloat16):",
            f"{indent}    {expr}  # bfloat16 compute, fp32 weights"]


def _spmd_step(run, engine, loss_fn: str) -> Piece:
    micro = run.config.micro_batches * run.config.grad_accumulation
    autocast = _autocast(run, engine)
    imports = ["import torch"] if autocast else []
    naive = engine == "naive"
    lines = [f"def train_step(model, optimizer, inputs, targets{', dp_group' * naive}) -> float:"]
    if micro == 1:
        lines += ['    """Forward, backward, then one optimizer step; this rank\'s loss."""',
                  *_forward("    ", autocast, loss_fn), "    loss.backward()"]
        total = "loss"
    else:
        imports.append("import contextlib")
        keep = {"ddp": "model.no_sync()", "zero1": "model.no_sync()",
                "fsdp": "local_gradients(model)", "replicate": "local_gradients(model)"}
        lines += ['    """MICRO_STEPS forward-backward passes, their gradients added up, then one',
                  '    optimizer step; this rank\'s loss (of its whole slice)."""',
                  "    total = 0",
                  "    chunks = zip(inputs.chunk(MICRO_STEPS), targets.chunk(MICRO_STEPS), "
                  "strict=True)",
                  "    for i, (inputs, targets) in enumerate(chunks):",
                  "        last = i == MICRO_STEPS - 1",
                  f"        with contextlib.nullcontext() if last else "
                  f"{keep.get(engine, 'contextlib.nullcontext()')}:",
                  *_forward("            ", autocast, loss_fn, " / MICRO_STEPS"),
                  "            loss.backward()  # gradients add up",
                  "        total = total + loss.detach()"]
        total = "total"
    if naive:
        lines.append("    average_gradients([model], dp_group)  # data parallelism by hand")
    lines += ["    optimizer.step()", "    optimizer.zero_grad(set_to_none=True)",
              f"    return {total}.item()"]
    return Piece("\n".join(lines), tuple(imports))


def _pipeline_step(run, engine) -> Piece:
    sync = ("    average_gradients([m for _, m in parts], dp_group)  # data parallelism by "
            "hand\n" if engine == "naive" else "")
    args = "schedule, parts, optimizer, inputs, targets" + (
        ", dp_group" if engine == "naive" else "")
    code = (f"def train_step({args}) -> float | None:\n"
            '    """MICRO_BATCHES micro-batches through the pipeline, then one optimizer step;\n'
            '    the micro-batches\' mean loss on the last stage, None on the others."""\n'
            "    first, last = parts[0][0] == 0, parts[-1][0] == len(STAGE_LAYERS) - 1\n"
            "    stage_losses = []\n"
            '    kwargs = {"target": targets, "losses": stage_losses} if last else {}\n'
            "    if first:  # the first stage takes the inputs; the others receive activations\n"
            "        schedule.step(inputs, **kwargs)\n"
            "    else:\n"
            "        schedule.step(**kwargs)\n"
            f"{sync}"
            "    optimizer.step()\n"
            "    optimizer.zero_grad(set_to_none=True)\n"
            "    return torch.stack(stage_losses).mean().item() if last else None")
    return Piece(code, ("import torch",))


def step_piece(run, engine) -> Piece:
    loss_fn = f"{MODEL_CLASS[run.config.model.name]}.loss"
    if run.engines.pipelined:
        return _pipeline_step(run, engine)
    return _spmd_step(run, engine, loss_fn)


def _mesh_lines(dims) -> tuple[list[str], tuple[str, ...]]:
    if not dims:
        return [], ()
    shape = ", ".join(str(d) for _, d in dims) + ("," if len(dims) == 1 else "")
    names = ", ".join(f'"{n}"' for n, _ in dims) + ("," if len(dims) == 1 else "")
    lines = (["# One mesh, a named dimension per parallelism; tp innermost: its ranks neighbours."]
             if "tp" in [n for n, _ in dims] else
             ["# One mesh of the ranks, a named dimension per parallelism."])
    lines += [f"mesh = init_device_mesh(device.type, ({shape}), mesh_dim_names=({names}))"]
    return lines, ("from torch.distributed.device_mesh import init_device_mesh",)


def _data_rank(dims, layout) -> str:
    names = [n for n, _ in dims]
    dp = 'mesh.get_local_rank("dp")' if "dp" in names else None
    fsdp = 'mesh.get_local_rank("fsdp")' if "fsdp" in names else None
    if dp and fsdp:
        return f"{dp} * {layout.fsdp} + {fsdp}"
    return dp or fsdp or "0"


def _build_lines(run, engine, model: str) -> tuple[list[str], list[str]]:
    """The model, then each parallelism in torchtitan's order."""
    config, layout, engines = run.config, run.layout, run.engines
    imports = ["import torch"]
    lines = ["# The model, its weights drawn from SEED on the host: the same on every rank."
             if config.precision != "bf16" else
             "# The model, its weights drawn from SEED on the host, made in bfloat16.",
             "torch.manual_seed(SEED)"]
    if config.precision == "bf16":
        lines += ["torch.set_default_dtype(torch.bfloat16)",
                  f"model = {model}(config).to(device)",
                  "torch.set_default_dtype(torch.float32)"]
    else:
        lines.append(f"model = {model}(config).to(device)")
    if layout.tp > 1:
        lines.append('apply_tp(model, mesh["tp"])  # § tensor parallelism: DTensor weights')
    if config.activation_checkpointing:
        imports.append("from torch.distributed._composable import checkpoint")
        lines += ["for block in model.blocks:  # § recompute each block in backward",
                  "    checkpoint(block)"]
    if engines.pipelined:
        lines += ["# § the pipeline: this rank's stages, the rest of the model dropped",
                  'parts = pipeline_stages(model, mesh.get_local_rank("pp"))']
    hsdp = layout.dp > 1 and layout.fsdp > 1
    shard = '"dp", "fsdp"' if hsdp else '"fsdp"'
    if engine == "fsdp":
        call = f"apply_fsdp({{}}, mesh[{shard}])"
        note = ("§ FSDP2: each rank keeps a shard of every weight, gradient and optimizer state"
                + (" (HSDP)" if hsdp else ""))
    elif engine == "replicate":
        imports.append("from torch.distributed._composable.replicate_with_fsdp import "
                       "replicate")
        call = 'replicate({}, mesh=mesh["dp"])'
        note = ("§ FSDP2's replicate, DDP for DTensor weights and pipeline stages: "
                "gradients all-reduced")
    else:
        call = None
    if call and engines.pipelined:
        lines += [f"# {note}", f"parts = [(i, {call.format('m')}) for i, m in parts]"]
    elif call:
        lines += [f"# {note}", f"model = {call.format('model')}"]
    if engine in ("ddp", "zero1"):
        imports.append("from torch.nn.parallel import DistributedDataParallel")
        lines += ["# § DDP: gradients all-reduced in buckets while backward runs",
                  'ids = [device.index] if device.type == "cuda" else None',
                  'model = DistributedDataParallel(model, device_ids=ids, process_group=mesh.'
                  'get_group("dp"),',
                  f"                                bucket_cap_mb={config.bucket_cap_mb!r})"]
    return _numbered(lines), imports


def _numbered(lines: list[str]) -> list[str]:
    """The parallelisms' comments numbered in the order they are applied ("# 1. ...")."""
    count = iter(range(1, 10))
    return [re.sub("§", lambda _: f"{next(count)}.", line) for line in lines]


def _optimizer_lines(run, engine, optimizer: str) -> tuple[list[str], list[str]]:
    params = ("[p for _, m in parts for p in m.parameters()]" if run.engines.pipelined
              else "model.parameters()")
    if engine == "zero1":
        return (["# ZeRO-1: each rank keeps and steps the optimizer state of its share",
                 f"params = {params}",
                 f"optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim."
                 f"{optimizer},",
                 '                                    lr=LR, process_group=mesh.get_group("dp"),'
                 ' foreach=False)'],
                ["from torch.distributed.optim import ZeroRedundancyOptimizer"])
    if not run.engines.pipelined:
        return [f"optimizer = torch.optim.{optimizer}(model.parameters(), lr=LR, "
                "foreach=False)"], []
    return ([f"params = {params}",
             f"optimizer = torch.optim.{optimizer}(params, lr=LR, foreach=False)"], [])


def main_piece(run, engine, dims, optimizer: str, data_fn: str, out: str,
               profile: str | None = None) -> Piece:
    family = run.config.model.name
    model = MODEL_CLASS[family]
    mesh, imports = _mesh_lines(dims)
    build, more = _build_lines(run, engine, model)
    opt, more2 = _optimizer_lines(run, engine, optimizer)
    imports = ("import argparse", "import os", "import sys", "import torch.distributed as dist",
               *imports, *more, *more2)
    extra = ", dp_group" if engine == "naive" else ""
    if engine == "naive":
        opt.append('dp_group = mesh.get_group("dp")  # the replicas averaged by hand')
    if run.engines.pipelined:
        opt.append(f'schedule = pipeline_schedule(parts, mesh.get_group("pp"), device, '
                   f'{model}.loss)')
        call = f"loss = train_step(schedule, parts, optimizer, inputs, targets{extra})"
        keep = ["    if loss is not None:  # the last stage's", "        losses.append(loss)"]
    else:
        call = f"loss = train_step(model, optimizer, inputs, targets{extra})"
        keep = ["    losses.append(loss)"]
    profiling = [] if profile is None else [  # the argument, start, each step, the end
        f'parser.add_argument("--profile", metavar="DIR", default={json.dumps(profile)},',
        '                    help="write a torch.profiler trace of the steps per rank here")',
        "profiler = start_profiler(args.profile, device)",
        "    profiler.step()", "profiler.stop()"]
    cast = []
    if run.config.precision == "bf16" and family == "mlp":
        cast = ["    inputs, targets = inputs.bfloat16(), targets.bfloat16()  # bf16 data"]
    body = [
        "parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])",
        f'parser.add_argument("--out", default={json.dumps(out)}, help="where rank 0 writes the '
        'losses")',
        *profiling[:2],
        "args = parser.parse_args()",
        "device = setup()",
        "if dist.get_world_size() != WORLD_SIZE:  # the mesh below has the layout's shape",
        '    raise SystemExit(f"{WORLD_SIZE} ranks train this run, not {dist.get_world_size()}")',
        *mesh,
        "# which slice of each batch this rank trains on"
        + (" (the ranks of a tp group: the same)" if run.layout.tp > 1 else ""),
        f"data_rank = {_data_rank(dims, run.layout)}",
        f"config = {type(run.config.model).__name__}()",
        "",
        *build, *opt,
        "",
        "losses = []",
        *profiling[2:3],
        "for step in range(STEPS):",
        f"    inputs, targets = {data_fn}(config, step, GLOBAL_BATCH, SEED)  # on the host",
        "    share = GLOBAL_BATCH // DATA_SIZE",
        "    inputs, targets = (t[data_rank * share:(data_rank + 1) * share].to(device)",
        "                       for t in (inputs, targets))",
        *cast,
        f"    {call}",
        *keep,
        *profiling[3:5],
        "write_losses(losses, args.out)",
        "dist.destroy_process_group()",
        "sys.stdout.flush()  # all written: skip Python's teardown, where torch's threads",
        "os._exit(0)  # can abort it (\"terminate called without an active exception\")",
    ]
    code = ("def main() -> None:\n" + "\n".join(f"    {line}" if line else "" for line in body)
            + '\n\n\nif __name__ == "__main__":\n    main()')
    return Piece(code, imports)
