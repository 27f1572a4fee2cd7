"""Every kind of strategy under torchrun (several in one launch, to start torch once), a
checkpointed run under torchrun resumed by a second launch, a worker killed mid-run and
restarted by torchrun (--max-restarts), two torchrun "nodes" on this machine, and the Slurm
batch script's launch command."""

from __future__ import annotations

import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import labkit
from labkit.training.checkpoint.lock import CheckpointLock

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))
# Every strategy of labkit.training.layout.presets on 2 ranks, in launches that start torch once
# each: the MLP's (micro-batches 2: the pipeline schedules), the tables' (DLRM), "single" (1 rank),
# and "naive_pipeline" (one whole batch at a time) in the two-node test below.
STRATEGIES = ["naive_dp", "ddp", "zero1", "fsdp", "tp", "gpipe", "1f1b", "interleaved_1f1b"]
TABLES = ["table_wise", "row_wise", "row_wise_dtensor"]
CHECKPOINTED = ["gpipe", "zero1"]  # stages, ZeRO-1's state (FSDP: test_checkpoint.py)


def _torchrun(cwd: Path, *args: str, launcher: tuple[str, ...] = (), model: str = "mlp",
              procs: int = 2) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [TORCHRUN, "--standalone", "--nproc-per-node", str(procs), *launcher, "-m", "labkit",
         "train", "--model", model, "--global-batch", "16", *args], cwd=cwd, capture_output=True,
        text=True, timeout=240, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def test_every_kind_of_strategy_runs_under_torchrun(tmp_path):
    from labkit.training.layout.presets import STRATEGIES as EVERY

    assert sorted([*STRATEGIES, *TABLES, "single", "naive_pipeline"]) == sorted(EVERY)
    _torchrun(tmp_path, "--strategy", *STRATEGIES, "--steps", "2", "--micro-batches", "2",
              "--out", str(tmp_path / "run.json"), "--profile", str(tmp_path / "traces"))
    first = {}
    for strategy in STRATEGIES:
        report = labkit.TrainReport.load(tmp_path / f"run.{strategy}.json")
        assert report.config.strategy == strategy and report.world_size == 2
        # --profile: a trace per rank, in a folder per strategy (several in one launch)
        assert report.traces == [str(tmp_path / "traces" / strategy / f"rank{r}.pt.trace.json")
                                 for r in range(2)]
        assert all("ProfilerStep#1" in Path(t).read_text() for t in report.traces)
        assert "torchrun" in report.where and report.estimate["peak_bytes"] > 0
        assert report.steps == 2 and all(math.isfinite(loss) for loss in report.losses)
        first[strategy] = report.losses[0]
    # One seed, the same initial weights and batch: the first loss agrees across layouts.
    assert max(first.values()) - min(first.values()) < 1e-5, first


def test_the_table_strategies_and_single_run_under_torchrun(tmp_path):
    """The embedding-table strategies (a DLRM, 2 ranks, one launch) and "single" (1 rank)."""
    _torchrun(tmp_path, "--params", "2e5", "--strategy", *TABLES, "--steps", "2", "--out",
              str(tmp_path / "t.json"), model="dlrm")
    _torchrun(tmp_path, "--strategy", "single", "--steps", "2", "--out",
              str(tmp_path / "s.json"), procs=1)
    for path, strategy, ranks in [(f"t.{name}.json", name, 2) for name in TABLES] + [
            ("s.json", "single", 1)]:
        report = labkit.TrainReport.load(tmp_path / path)
        assert report.config.strategy == strategy and report.world_size == ranks
        assert report.steps == 2 and all(math.isfinite(loss) for loss in report.losses)


def test_a_torchrun_run_resumes_from_its_checkpoint(tmp_path):
    """A pipeline and ZeRO-1 in one launch, each into a folder of its own; a second
    launch resumes both; a third, while another run holds a folder, is refused."""
    ckpt = tmp_path / "ckpt"
    common = ("--strategy", *CHECKPOINTED, "--micro-batches", "2", "--checkpoint-dir",
              str(ckpt), "--checkpoint-every", "1")
    _torchrun(tmp_path, *common, "--steps", "2", "--out", str(tmp_path / "a.json"))
    _torchrun(tmp_path, *common, "--steps", "3", "--out", str(tmp_path / "b.json"))
    for strategy in CHECKPOINTED:
        first = labkit.TrainReport.load(tmp_path / f"a.{strategy}.json")
        resumed = labkit.TrainReport.load(tmp_path / f"b.{strategy}.json")
        assert resumed.ranks[0]["resumed_at"] == 2 and resumed.steps == 3
        assert resumed.losses[:2] == first.losses
        assert [r.get("from_checkpoint", False) for r in resumed.ranks[0]["records"]] == [
            True, True, False]
        assert sorted(p.name for p in (ckpt / strategy).iterdir()) == [
            "LOCK", "step-00000001", "step-00000002", "step-00000003"]
    held = ckpt / CHECKPOINTED[0]
    with CheckpointLock(held), pytest.raises(AssertionError, match="in use by another run"):
        _torchrun(tmp_path, "--strategy", CHECKPOINTED[0], "--micro-batches", "2",
                  "--checkpoint-dir", str(held), "--steps", "4", "--out",
                  str(tmp_path / "c.json"))
    assert not (held / "step-00000004").exists()


def test_every_training_option_reaches_the_config_from_the_command_line():
    """Each TrainConfig option torchrun offers lands in the run's config (read without
    starting torchrun: the parser and the configs it makes)."""
    import argparse

    from labkit.training.torchrun import _configs, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([
        "--model", "gpt", "--layout", "fsdp=2,tp=2", "--global-batch", "32", "--steps", "3",
        "--precision", "mixed", "--micro-batches", "1", "--grad-accumulation", "2",
        "--activation-checkpointing", "--checkpoint-dir", "ckpt", "--checkpoint-every", "2",
        "--checkpoint-keep", "3", "--cp-engine", "ring", "--profile", "traces"])
    [(config, out)] = _configs(args)
    assert (config.layout, config.global_batch, config.steps) == (
        labkit.Layout(fsdp=2, tp=2), 32, 3)
    assert (config.precision, config.grad_accumulation, config.activation_checkpointing) == (
        "mixed", 2, True)
    assert (config.checkpoint_dir, config.checkpoint_every, out) == ("ckpt", 2, "report.json")
    assert config.checkpoint_keep == 3
    assert config.cp_engine == "ring"  # on GPUs a torchrun user can choose labkit's ring
    assert config.profile == "traces"


def test_the_layout_flag_takes_degrees_and_engine_choices():
    from labkit.training.torchrun import parse_layout

    assert parse_layout("dp=2,pp=2,schedule=gpipe") == (labkit.Layout(dp=2, pp=2),
                                                        {"schedule": "gpipe"})
    with pytest.raises(ValueError, match="the cp engine is its own flag: --cp-engine ring"):
        parse_layout("cp=2,cp_engine=ring")
    with pytest.raises(ValueError, match="cannot read layout 'pp=2,schedul=gpipe'"):
        parse_layout("pp=2,schedul=gpipe")


def test_torchrun_restarts_a_killed_worker_and_the_run_resumes_exactly(two, tmp_path):
    """Rank 1 is SIGKILLed after 3 steps (a planted failure); torchrun restarts the workers
    (--max-restarts 1) and the run resumes from its step-2 checkpoint: the same losses as a
    run never interrupted, bit for bit."""
    ckpt = tmp_path / "ckpt"
    _torchrun(tmp_path, "--strategy", "ddp", "--steps", "5", "--checkpoint-dir",
                    str(ckpt), "--checkpoint-every", "2", "--kill-rank-at-step", "1", "3",
                    "--out", str(tmp_path / "r.json"), launcher=("--max-restarts", "1"))
    report = labkit.TrainReport.load(tmp_path / "r.json")
    reference = labkit.train(two, labkit.TrainConfig(model="mlp", strategy="ddp",
                                                     global_batch=16, steps=5),
                             estimate=False)
    # One launch into an empty folder, resumed at step 2: its workers were started again.
    assert report.ranks[0]["resumed_at"] == 2 and report.losses == reference.losses
    assert [r.get("from_checkpoint", False) for r in report.ranks[1]["records"]] == [
        True, True, False, False, False]
    assert sorted(p.name for p in ckpt.iterdir()) == [  # the restarted rank 0 took LOCK
        "LOCK", "step-00000002", "step-00000004", "step-00000005"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listens(pid: int, port: int) -> bool:
    """Whether process ``pid`` itself listens on ``port`` (not a stranger that took it)."""
    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except psutil.NoSuchProcess:
        return False
    return any(c.status == psutil.CONN_LISTEN and c.laddr.port == port for c in connections)


def _start_host_node(command: list[str], env: dict, cwd: Path) -> tuple[subprocess.Popen, int]:
    """The node that hosts the rendezvous store (``is_host=1``), once its port accepts
    connections. A port taken between the probe and the bind makes the host fail at once
    (it never falls back to joining a stranger's listener): then a fresh port is tried."""
    for _ in range(3):
        port = _free_port()
        node = subprocess.Popen(
            [*command[:1], "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=1",
             *command[1:]], cwd=cwd, env=env, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
        while node.poll() is None and not _listens(node.pid, port):
            time.sleep(0.1)
        if node.poll() is None:
            return node, port
        output = node.communicate()[0]
        assert "C10d store has failed" in output, output[-3000:]  # a lost port race only
    pytest.fail("no free port held long enough for the rendezvous store, three times")


def test_two_torchrun_nodes_meet_at_one_rendezvous_endpoint(tmp_path):
    """``--nnodes 2``: two launchers (two "nodes" on this machine), one process each, one
    c10d rendezvous endpoint; one run of 2 ranks, its report written by global rank 0.
    One node hosts the store, the other joins it, as on two machines."""
    command = [TORCHRUN, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-id", "two-nodes", "-m",
               "labkit", "train", "--model", "mlp", "--global-batch", "16", "--strategy",
               "fsdp", "naive_pipeline", "--steps", "2", "--out", str(tmp_path / "r.json")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    host, port = _start_host_node(command, env, tmp_path)
    nodes = [host, subprocess.Popen(
        [*command[:1], "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-conf", "is_host=0",
         *command[1:]], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True)]
    try:
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    except subprocess.TimeoutExpired:
        for node in nodes:
            node.kill()
        outputs = [node.communicate()[0] or "" for node in nodes]
        pytest.fail("two nodes ran past 240 s:\n" + "\n".join(o[-3000:] for o in outputs))
    finally:
        for node in nodes:
            node.kill()
    assert [node.returncode for node in nodes] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    for strategy in ("fsdp", "naive_pipeline"):  # a pipeline's stages on two "nodes"
        report = labkit.TrainReport.load(tmp_path / f"r.{strategy}.json")
        assert report.world_size == 2 and report.steps == 2
        assert all(math.isfinite(loss) for loss in report.losses)


def test_the_slurm_script_launches_torchrun_with_arguments_both_parsers_accept(tmp_path):
    """``scripts/slurm/train.sbatch``: bash syntax; its launch command (printed by a dry run
    with a stand-in ``scontrol``) is read by torchrun's own parser and labkit's, and the run
    it asks for passes labkit's checks for its rank count."""
    import argparse

    from torch.distributed.run import get_args_parser

    from labkit.training.run import resolve
    from labkit.training.torchrun import _configs, add_arguments

    script = Path(__file__).parent.parent / "scripts" / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True)
    (tmp_path / "scontrol").write_text("#!/bin/sh\necho gpu-node-1\necho gpu-node-2\n")
    (tmp_path / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "lk", "SLURM_JOB_NODELIST": "gpu-node-[1-2]",
           "LABKIT_DRY_RUN": "1"}
    printed = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                             check=True).stdout
    command = shlex.split(printed)
    assert command[0] == "torchrun"
    launcher = get_args_parser().parse_args(command[1:])
    assert (launcher.nnodes, launcher.nproc_per_node, launcher.rdzv_endpoint) == (
        "2", "8", "gpu-node-1:29500")
    assert launcher.max_restarts == 3 and launcher.module
    assert launcher.training_script == "labkit" and launcher.training_script_args[0] == "train"
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    [(config, _)] = _configs(parser.parse_args(launcher.training_script_args[1:]))
    resolve(config, 16, "cuda", "nccl")
    assert config.checkpoint_dir.endswith("checkpoints/lk") and config.checkpoint_every
    # SCRIPT=...: the script labkit wrote, under the same launcher
    printed = subprocess.run(["bash", str(script)], env={**env, "SCRIPT": "train.py"},
                             capture_output=True, text=True, check=True).stdout
    launcher = get_args_parser().parse_args(shlex.split(printed)[1:])
    assert not launcher.module and launcher.nproc_per_node == "8"
    assert launcher.max_restarts == 0  # it would start again from step 0
    assert [launcher.training_script, *launcher.training_script_args] == [
        "train.py", "--out", "losses-7.json"]


def test_several_strategies_in_one_launch_checkpoint_into_folders_of_their_own():
    """Found by review: ``--strategy ddp fsdp --checkpoint-dir D`` gave both runs folder D;
    the strategy may change on resumption, so fsdp 'resumed' ddp's last checkpoint and
    trained no step of its own, its report ddp's records."""
    import argparse

    from labkit.training.torchrun import _configs, add_arguments

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    runs = _configs(parser.parse_args(["--strategy", "ddp", "fsdp", "--checkpoint-dir", "ck"]))
    assert [c.checkpoint_dir for c, _ in runs] == [os.path.join("ck", "ddp"),
                                                   os.path.join("ck", "fsdp")]
    [(one, _)] = _configs(parser.parse_args(["--strategy", "fsdp", "--checkpoint-dir", "ck"]))
    assert one.checkpoint_dir == "ck"  # one run: the folder given, as documented


def test_the_slurm_script_gives_srun_the_job_s_cores_per_task(tmp_path):
    """Found by review: since Slurm 22.05 srun no longer inherits sbatch's --cpus-per-task
    (its release notes): there torchrun and its 8 workers were pinned to one core. The
    script passes it on itself."""
    script = Path(__file__).parent.parent / "scripts" / "slurm" / "train.sbatch"
    for name, body in (("scontrol", "echo gpu-node-1"), ("srun", 'printf "%s\\n" "$@"')):
        (tmp_path / name).write_text(f"#!/bin/sh\n{body}\n")
        (tmp_path / name).chmod(0o755)
    env = {**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}", "SLURM_NNODES": "2",
           "SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "lk", "SLURM_JOB_NODELIST": "gpu-node-1",
           "SLURM_CPUS_PER_TASK": "32"}
    srun_args = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True,
                               check=True).stdout.split("\n")
    assert "--cpus-per-task=32" in srun_args[:srun_args.index("torchrun")]
