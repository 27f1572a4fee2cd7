"""The pieces of a written script that set up its processes and apply each parallelism:
one function per parallelism, each call with a comment."""

from __future__ import annotations

import textwrap

from labkit.training.script.source import Piece, block

_UNIT = {"gpt": "Block", "mlp": "nn.Linear"}  # what FSDP gathers as one (models/*_split.py)
_LAYERS = {"gpt": "[GPTEmbedding(model), *model.blocks, model.norm, model.head]",
           "mlp": "list(model.layers)"}
_SCHEDULE = {"gpipe": "ScheduleGPipe", "1f1b": "Schedule1F1B",
             "interleaved_1f1b": "ScheduleInterleaved1F1B"}


def setup_piece(cpu: bool) -> Piece:
    """This process's device, from torchrun's LOCAL_RANK, and its process group."""
    if cpu:
        return block('''
            def setup() -> torch.device:
                """Join the process group: one CPU core per rank, over gloo."""
                torch.set_num_threads(1)  # one core per rank, as labkit's CPU ranks
                dist.init_process_group("gloo")
                return torch.device("cpu")
        ''', "import torch", "import torch.distributed as dist")
    return block('''
        def setup() -> torch.device:
            """Join the process group: this rank's GPU (LOCAL_RANK, set by torchrun) over NCCL,
            or without GPUs one CPU core over gloo."""
            if torch.cuda.is_available():
                device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
                torch.cuda.set_device(device)  # NCCL's collectives run on this rank's GPU
                dist.init_process_group("nccl", device_id=device)
                return device
            torch.set_num_threads(1)  # one core per rank, as labkit's CPU ranks
            dist.init_process_group("gloo")
            return torch.device("cpu")
    ''', "import os", "import torch", "import torch.distributed as dist")


def pipeline_pieces(family: str, schedule: str) -> list[Piece]:
    """This rank's stages, and the schedule that drives them."""
    stages = block(f'''
        def pipeline_stages(model: nn.Module, pp_rank: int) -> list[tuple[int, nn.Module]]:
            """This rank's stages (index, module): the model as a chain of layers cut into
            STAGE_LAYERS; rank r holds stages r, r + PP, ... (interleaved: two each)."""
            layers = {_LAYERS[family]}
            return [(i, nn.Sequential(*layers[a:b])) for i, (a, b) in enumerate(STAGE_LAYERS)
                    if i % PP == pp_rank]
    ''', "from torch import nn")
    if schedule == "interleaved_1f1b":
        make = (f"{_SCHEDULE[schedule]}(stages, MICRO_BATCHES, loss_fn=loss_fn)  # two stages "
                "per rank")
    else:
        make = f"{_SCHEDULE[schedule]}(stages[0], MICRO_BATCHES, loss_fn=loss_fn)"
    runner = block(f'''
        def pipeline_schedule(parts, pp_group, device: torch.device, loss_fn):
            """A PipelineStage per part (each sends its output to the next stage's rank over
            pp_group), driven by the {schedule} schedule over MICRO_BATCHES micro-batches."""
            stages = [PipelineStage(module, index, len(STAGE_LAYERS), device, group=pp_group)
                      for index, module in parts]
            return {make}
    ''', "import torch", f"from torch.distributed.pipelining import PipelineStage, "
         f"{_SCHEDULE[schedule]}")
    return [stages, runner]


def _fsdp(family: str, hsdp: bool, precision: str) -> Piece:
    unit = _UNIT[family]
    what = {"gpt": "each block", "mlp": "each linear layer"}[family]
    over = "mesh (HSDP: sharded over fsdp, replicated over dp)" if hsdp else "mesh"
    doc = (f'"""FSDP2 over {over}: {what} one unit, gathered just before it computes and '
           'freed after; then the part itself, which takes what is left."""')
    lines = ["def apply_fsdp(part: nn.Module, mesh) -> nn.Module:",
             textwrap.fill(doc, 96, initial_indent="    ", subsequent_indent="    "),
             f"    units = [m for m in part.modules() if isinstance(m, {unit}) and m is not part]"]
    imports = ["from torch.distributed.fsdp import fully_shard", "from torch import nn"]
    inner = outer = ""
    if precision == "mixed":
        imports += ["import torch", "from torch.distributed.fsdp import MixedPrecisionPolicy"]
        lines += ["    # mixed precision: the fp32 shards gathered as bfloat16 for compute, "
                  "gradients",
                  "    # reduced in fp32; the part's output (the loss's input) back in fp32",
                  "    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                  "reduce_dtype=torch.float32)",
                  "    outermost = MixedPrecisionPolicy(param_dtype=torch.bfloat16, "
                  "reduce_dtype=torch.float32,",
                  "                                     output_dtype=torch.float32)"]
        inner, outer = ", mp_policy=policy", ", mp_policy=outermost"
    lines += ["    for unit in units:  # all-gathered for forward and backward, gradients "
              "reduce-scattered",
              f"        fully_shard(unit, mesh=mesh{inner})",
              f"    return fully_shard(part, mesh=mesh{outer})"]
    return Piece("\n".join(lines), tuple(imports))


def _naive(tp: bool) -> Piece:
    local = ("        grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad\n"
             if tp else "        grad = p.grad\n")
    imports = ["import torch.distributed as dist", "from torch import nn"]
    imports += ["from torch.distributed.tensor import DTensor"] if tp else []
    code = ("def average_gradients(parts: list[nn.Module], group) -> None:\n"
            '    """Data parallelism by hand: every gradient summed over the replicas, then\n'
            '    divided by their number (one AllReduce per tensor)."""\n'
            "    size = dist.get_world_size(group)\n"
            "    for p in (p for part in parts for p in part.parameters() if p.grad is not None):\n"
            f"{local}"
            "        dist.all_reduce(grad, group=group)  # the sum over the replicas\n"
            "        grad /= size  # their mean: the gradient of the whole batch")
    return Piece(code, tuple(imports))


_LOCAL_FSDP = block('''
    @contextlib.contextmanager
    def local_gradients(part: nn.Module):
        """Keep gradients on this rank (micro-steps but the last): no reduction yet."""
        part.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            part.set_requires_gradient_sync(True)
''', "import contextlib", "from torch import nn")


def data_parallel_pieces(run, engine: str | None, shard_dims) -> list[Piece]:
    """FSDP2's ``fully_shard``, or the hand-written average; DDP and FSDP2's ``replicate``
    are one call each, written in ``main``."""
    family, precision = run.config.model.name, run.config.precision
    micro = run.config.micro_batches * run.config.grad_accumulation
    pieces = []
    if engine == "fsdp":
        pieces.append(_fsdp(family, len(shard_dims) == 2, precision))
    if engine == "naive":
        pieces.append(_naive(run.layout.tp > 1))
    if engine in ("fsdp", "replicate") and micro > 1 and not run.engines.pipelined:
        pieces.append(_LOCAL_FSDP)
    return pieces


def write_piece(pipelined: bool) -> Piece:
    """``write_losses``; in a pipeline only the last stages' ranks have losses to give."""
    if pipelined:
        doc = ("the mean over the ranks that computed one (each\n    its own slice of the "
               "batch; a pipeline's earlier stages compute none).")
        keep = "        kept = [r for r in gathered if r]  # the ranks that computed losses\n"
    else:
        doc, keep = "the mean over the ranks (each its own slice).", ""
    code = (f'def write_losses(losses: list[float], out: str) -> None:\n'
            f'    """Rank 0 writes each step\'s loss: {doc}"""\n'
            "    gathered = [None] * dist.get_world_size() if dist.get_rank() == 0 else None\n"
            "    dist.gather_object(losses, gathered, dst=0)\n"
            "    if dist.get_rank() == 0:\n"
            f"{keep}"
            "        per_step = [statistics.fmean(step) for step in zip("
            f"*{'kept' if pipelined else 'gathered'}, strict=True)]\n"
            '        with open(out, "w") as file:\n'
            '            json.dump({"losses": per_step}, file)\n'
            '        print(f"loss {per_step[0]:.4f} -> {per_step[-1]:.4f}; written to {out}")')
    return Piece(code, ("import json", "import statistics", "import torch.distributed as dist"))


def profile_piece() -> Piece:
    return block('''
        def start_profiler(folder: str, device: torch.device) -> profile:
            """torch.profiler over the steps after the first two (they build lazy state), one
            Chrome trace per rank in ``folder`` for Perfetto (ui.perfetto.dev) or TensorBoard;
            rank 0 first deletes traces of ranks this run has not (a larger run's)."""
            os.makedirs(folder, exist_ok=True)
            for name in os.listdir(folder) if dist.get_rank() == 0 else []:
                rank = name.removeprefix("rank").removesuffix(".pt.trace.json")
                if rank.isdigit() and int(rank) >= dist.get_world_size():
                    os.remove(os.path.join(folder, name))
            path = os.path.join(folder, f"rank{dist.get_rank()}.pt.trace.json")
            activities = [ProfilerActivity.CPU] + [ProfilerActivity.CUDA] * (device.type == "cuda")
            wait = 1 if STEPS > 2 else 0  # the first step builds lazy state
            warmup = 1 if STEPS > 1 else 0  # the profiler's own warm-up step
            profiler = profile(activities=activities, schedule=schedule(
                wait=wait, warmup=warmup, active=STEPS - wait - warmup, repeat=1),
                on_trace_ready=lambda p: p.export_chrome_trace(path))
            profiler.start()
            return profiler
    ''', "import os", "import torch", "import torch.distributed as dist",
        "from torch.profiler import ProfilerActivity, profile, schedule")
