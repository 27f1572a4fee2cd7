"""The standalone scripts ``python -m labkit script`` writes: under torchrun each gives the
losses ``torchrun -m labkit train`` reports for the same arguments (DDP, FSDP, TP, 1F1B and
fsdp=2,tp=2, on CPU ranks over gloo), every layout written passes ruff and imports torch and
the standard library only, and what labkit writes no script for is refused with the reason."""

from __future__ import annotations

import ast
import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import labkit
from labkit.__main__ import main as labkit_main
from labkit.training.script import ScriptRefused

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
TORCHRUN = shutil.which("torchrun", path=str(BIN))
# A tiny GPT (2 blocks, d_model 32), 2 steps of 2 micro-batches: every path of the step
# (accumulation under DDP's no_sync and FSDP's, the pipeline's micro-batches) in seconds.
RUN = ["--model", "gpt", "--params", "30000", "--global-batch", "8", "--steps", "2",
       "--micro-batches", "2", "--lr", "0.01"]
ON_TWO = ["ddp", "fsdp", "tp", "1f1b"]


def _torchrun(procs: int, cwd: Path, *args: str) -> None:
    """torchrun in ``cwd``; labkit on the path only for ``-m labkit`` (a script runs alone)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["OMP_NUM_THREADS"] = "1"
    if args[0] == "-m":
        env["PYTHONPATH"] = str(REPO)
    result = subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(procs), *args],
                            cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]


def _write(tmp_path: Path, name: str, *args: str) -> Path:
    path = tmp_path / f"{name}.py"
    assert labkit_main(["script", *RUN, *args, "--out-script", str(path)]) == 0
    return path


def _losses_of_script(tmp_path: Path, procs: int, script: Path) -> list[float]:
    out = tmp_path / f"{script.stem}.json"
    _torchrun(procs, tmp_path, str(script), "--out", str(out))
    return json.loads(out.read_text())["losses"]


@pytest.fixture(scope="module")
def labkit_losses(tmp_path_factory) -> dict[str, list[float]]:
    """labkit's losses for each strategy on 2 ranks, from one torchrun launch."""
    folder = tmp_path_factory.mktemp("labkit")
    _torchrun(2, folder, "-m", "labkit", "train", *RUN, "--strategy", *ON_TWO,
              "--out", str(folder / "r.json"))
    return {name: labkit.TrainReport.load(folder / f"r.{name}.json").losses for name in ON_TWO}


@pytest.mark.parametrize("strategy", ON_TWO)
def test_the_script_gives_labkits_losses(strategy, labkit_losses, tmp_path):
    traces = tmp_path / "traces"
    profile = ("--profile", str(traces)) if strategy == "ddp" else ()  # its --profile default
    script = _write(tmp_path, strategy, "--strategy", strategy, "--world-size", "2", *profile)
    if profile:  # a 4-rank run's trace left in the folder: not this run's, removed
        traces.mkdir()
        (traces / "rank3.pt.trace.json").write_text("{}")
    losses = _losses_of_script(tmp_path, 2, script)
    assert len(losses) == 2
    assert losses == pytest.approx(labkit_losses[strategy], rel=1e-6, abs=0), strategy
    if profile:  # a torch.profiler trace per rank, DDP's AllReduce in it
        for rank in range(2):
            names = {e.get("name") for e in json.loads(
                (traces / f"rank{rank}.pt.trace.json").read_text())["traceEvents"]}
            assert {"gloo:all_reduce", "ProfilerStep#1"} <= names
        assert sorted(os.listdir(traces)) == ["rank0.pt.trace.json", "rank1.pt.trace.json"]


def test_the_2d_script_gives_labkits_losses(tmp_path):
    """fsdp=2,tp=2 on 4 ranks: tensor parallelism inside each FSDP shard group."""
    args = ("--layout", "fsdp=2,tp=2")
    script = _write(tmp_path, "fsdp_tp", *args)
    text = script.read_text()
    assert text.index("parallelize_module(") < text.index("fully_shard(unit")  # TP, then FSDP
    losses = _losses_of_script(tmp_path, 4, script)
    _torchrun(4, tmp_path, "-m", "labkit", "train", *RUN, *args, "--out", str(tmp_path / "r.json"))
    assert losses == pytest.approx(labkit.TrainReport.load(tmp_path / "r.json").losses,
                                   rel=1e-6, abs=0)


# Every kind of layout a script is written for (run by hand: each gives labkit's losses too).
WRITTEN = {
    "single": ("--strategy", "single"),
    "naive_dp": ("--strategy", "naive_dp", "--world-size", "2"),
    "zero1": ("--strategy", "zero1", "--world-size", "2", "--optimizer", "sgd"),
    "hsdp": ("--layout", "dp=2,fsdp=2", "--precision", "mixed"),
    "dp_tp": ("--layout", "dp=2,tp=2"),
    "dp_tp_naive": ("--layout", "dp=2,tp=2,dp_kind=naive"),
    "gpipe_fsdp": ("--layout", "pp=2,fsdp=2,schedule=gpipe"),
    "interleaved_dp": ("--layout", "pp=2,dp=2,schedule=interleaved_1f1b"),
    "pp_tp_naive": ("--layout", "pp=2,tp=2,dp=2,dp_kind=naive"),
    "cpu": ("--strategy", "ddp", "--world-size", "2", "--cpu"),
    "bf16_checkpointed": ("--strategy", "fsdp", "--world-size", "2", "--precision", "bf16",
                          "--activation-checkpointing", "--grad-accumulation", "2"),
}


def test_every_written_script_passes_ruff_and_imports_only_torch(tmp_path):
    scripts = [_write(tmp_path, name, *args) for name, args in WRITTEN.items()]
    scripts += [_write(tmp_path, name, "--strategy", name, "--world-size", "2")
                for name in ON_TWO]
    scripts.append(_write(tmp_path, "fsdp_tp", "--layout", "fsdp=2,tp=2"))
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--config",
                             str(REPO / "pyproject.toml"), *map(str, scripts)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    allowed = {"torch", *sys.stdlib_module_names}
    for script in scripts:
        text = script.read_text()
        tree = ast.parse(text)
        roots = {alias.name.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.Import) for alias in node.names}
        roots |= {node.module.split(".")[0] for node in ast.walk(tree)
                  if isinstance(node, ast.ImportFrom)}
        assert roots <= allowed, (script.name, roots - allowed)
        on_gpus = "LOCAL_RANK" in text and "torch.cuda.set_device" in text
        assert on_gpus == (script.stem != "cpu"), script.name
        lines = len(text.splitlines())
        # one parallelism, or FSDP with TP: a page to read; composed layouts with a pipeline,
        # a precision or recomputation add their pieces
        limit = {"fsdp_tp": 255}.get(script.stem, 250 if script.stem in ON_TWO else 300)
        assert lines <= (limit if "GPT" in text[:200] else 200), (script.name, lines)


@pytest.mark.parametrize("shape", [
    {}, {"position": "rope", "mlp": "swiglu", "norm": "rmsnorm", "n_kv_heads": 2,
         "bias": False, "tie_embeddings": True}])
def test_the_scripts_gpt_is_the_zoos(shape, tmp_path):
    """A GPT-2-style block and a Llama-style one: the script's model (the zoo's source with
    the branches its config does not take cut) has the zoo's weights and outputs."""
    import torch

    config = labkit.models.GPTConfig(vocab_size=64, seq_len=16, d_model=32, **shape)
    text = labkit.script(model=config, strategy="tp", world_size=2, path=tmp_path / "t.py")
    space = runpy.run_path(str(tmp_path / "t.py"), run_name="written")  # main() does not run
    torch.manual_seed(0)
    model = space["GPT"](space["GPTConfig"]())
    zoo = labkit.models.build_model(config)
    assert {n: p.shape for n, p in model.state_dict().items()} == {
        n: p.shape for n, p in zoo.state_dict().items()}
    for name, value in zoo.state_dict().items():
        assert torch.equal(model.state_dict()[name], value), name
    tokens, _ = space["gpt_batch"](space["GPTConfig"](), 0, 4)
    assert torch.equal(model(tokens), zoo(tokens))
    assert ("rotary" in text) == ("position" in shape)


def test_a_cell_writes_the_same_script(tmp_path):
    config = labkit.TrainConfig(model="mlp", layout=labkit.Layout(fsdp=2, tp=2), steps=3)
    text = labkit.script(config, path=tmp_path / "train.py")
    assert (tmp_path / "train.py").read_text() == text and text.world_size == 4
    assert text.command == "torchrun --nproc-per-node 4 train.py"
    assert "```python" in text._repr_markdown_()
    assert "init_device_mesh(device.type, (2, 2), mesh_dim_names=(\"fsdp\", \"tp\"))" in text
    assert labkit.script(model="mlp", strategy="ddp", world_size=2) == labkit.script(
        labkit.TrainConfig(model="mlp", strategy="ddp"), world_size=2)
    with pytest.raises(ValueError, match="world_size=4"):
        labkit.script(model="mlp", strategy="ddp")


REFUSED = {
    "table_wise": (("--model", "dlrm", "--strategy", "table_wise", "--world-size", "2"),
                   "embedding tables are placed by labkit's planner"),
    "experts": (("--model", "moe_gpt", "--layout", "dp=2,ep=2"), "all-to-all"),
    "cp": (("--model", "gpt", "--layout", "cp=2"), "context_parallel runs on CUDA only"),
    "naive_pipeline": (("--strategy", "naive_pipeline", "--world-size", "2"),
                       "choose schedule='gpipe'"),
    "naive_1f1b": (("--layout", "pp=2,schedule=naive_1f1b", "--micro-batches", "2"),
                   "choose schedule='1f1b'"),
    "naive_tp": (("--layout", "tp=2,tp_kind=naive"), "choose tp_kind='dtensor'"),
    "checkpoints": (("--strategy", "ddp", "--world-size", "2", "--checkpoint-dir", "ckpt"),
                    "saves no checkpoint"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_what_labkit_writes_no_script_for_is_refused_with_the_reason(name, tmp_path, capsys):
    args, reason = REFUSED[name]
    path = tmp_path / "train.py"
    assert labkit_main(["script", "--global-batch", "8", *args, "--out-script", str(path)]) == 2
    assert reason in capsys.readouterr().err and not path.exists()
    config = labkit.TrainConfig(model="mlp", strategy="naive_pipeline")
    with pytest.raises(ScriptRefused, match="hand-written"):
        labkit.script(config, world_size=2)


def test_the_command_line_says_what_it_needs(tmp_path, capsys):
    assert labkit_main(["script", "--strategy", "ddp", "--out-script",
                        str(tmp_path / "t.py")]) == 2
    assert "--world-size" in capsys.readouterr().err
    assert labkit_main(["script", "--strategy", "ddp", "--kill-rank-at-step", "0", "1",
                        "--world-size", "2"]) == 2
    assert "saves no checkpoint" in capsys.readouterr().err
    assert labkit_main(["script", "--strategy", "ddp", "fsdp", "--world-size", "2",
                        "--out-script", str(tmp_path / "t.py")]) == 0
    assert (tmp_path / "t.ddp.py").exists() and (tmp_path / "t.fsdp.py").exists()
    for name in ("ddp", "fsdp"):  # each script names the run it is, alone
        assert f"-m labkit train --strategy {name} --world" not in (tmp_path / f"t.{name}.py"
                                                                     ).read_text()
        assert f"-m labkit train --strategy {name}\n" in (tmp_path / f"t.{name}.py").read_text()
