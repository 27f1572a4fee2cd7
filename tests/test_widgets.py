"""Widgets driven in plain pytest: move a slider, the output changes (quizzes: test_quiz.py)."""

from __future__ import annotations

import pytest

import labkit


def test_memory_explorer_slider_redraws_and_reports_the_oom():
    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        box = labkit.widgets.memory_explorer(cluster, "mlp", sizes=(1e5, 3e6),
                                             memory_per_device="20MiB", global_batch=8)
        first_png = box.plot.outputs[0]["data"]["image/png"]
        assert box.message.value.startswith("Fits")
        box.slider.value = box.slider.options[1][1]
        box.runner.wait(timeout=60)  # the run happens off the kernel's thread
        assert box.plot.outputs[0]["data"]["image/png"] != first_png
        assert box.message.value.startswith("DeviceOOM")
        fig = labkit.widgets.memory_explorer(cluster, "mlp", sizes=(1e5, 3e6),
                                             memory_per_device="20MiB", global_batch=8,
                                             size=1e5, interactive=False)
        assert fig.axes and fig.axes[0].get_title().startswith("mlp")


def test_latest_only_never_piles_up_runs():
    import threading
    import time

    from labkit.lessons.show.render import LatestOnly

    done, gate = [], threading.Event()

    def work(value):
        gate.wait(5)
        done.append(value)

    runner = LatestOnly(work)
    runner.submit(1)  # starts at once, then blocks on the gate
    time.sleep(0.1)
    for value in range(2, 10):  # a slider dragged over 8 values while 1 runs
        runner.submit(value)
    gate.set()
    runner.wait(5)
    assert done == [1, 9]  # the first, then only the newest


def test_cluster_runs_from_two_threads_take_turns():
    import threading

    with labkit.Cluster(1, device="cpu", progress=False) as cluster:
        results = []
        threads = [threading.Thread(target=lambda: results.append(cluster.run(lambda ctx: 7)))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert results == [[7]] * 4


def test_controls_are_shared_and_labelled():
    from labkit.lessons.show import controls

    assert controls.gpu_count_slider([4, 1, 2]).value == 4
    size = controls.model_size_slider([200_000, 1_000_000])
    assert size.options[0] == ("0.2M params", 200_000) and size.description == "model size"
    assert controls.memory_cap_slider([2**20, 2**30]).options[1][0] == "1 GiB"
    assert controls.strategy_picker().value == "ddp"
    assert controls.micro_batches_slider().options == (1, 2, 4, 8)


def test_the_kill_button_kills_a_rank_mid_run_and_the_run_resumes_exactly(tmp_path,
                                                                         monkeypatch):
    """Notebook 10's kill button: the run trains in a background thread (the kernel stays
    free); a click SIGKILLs the chosen rank's process; the run resumes from the last
    checkpoint with the uninterrupted run's losses. Headless, rank 1 is killed by the same
    ``kill`` after ``at_step`` steps. Afterwards: no process but the cluster's own."""
    import os
    import signal
    import threading
    import time

    from labkit.lessons.checkpoints.kill import KillSwitch, kill_switch
    from labkit.models import MLPConfig
    from labkit.training.checkpoint import CheckpointError
    from labkit.training.checkpoint.lock import CheckpointLock
    from tests.conftest import descendants

    config = labkit.TrainConfig(model=MLPConfig(d_hidden=32, n_layers=2), strategy="fsdp",
                                global_batch=16, steps=6)
    with labkit.Cluster(2, device="cpu", progress=False) as cluster:
        reference = labkit.train(cluster, config, estimate=False)
        def saved(name):
            folder = name if name.startswith("~") else str(tmp_path / name)
            return config.replace(checkpoint_dir=folder, checkpoint_every=2)

        monkeypatch.setenv("HOME", str(tmp_path))  # "~/a": saved where the recovery looks
        headless = kill_switch(cluster, saved("~/a"),
                               reference, rank=1, at_step=3, interactive=False)
        recovery = headless.result()
        assert "rank 1" in recovery.error and "SIGKILL" in recovery.error
        assert (recovery.failed_after, recovery.resumed_at, recovery.lost_steps) == (3, 2, 1)
        assert recovery.report.losses == reference.losses and headless.figure is not None
        last = recovery.report.ranks[0]["records"][-1]["loss"]
        assert headless.losses[6] == float(f"{last:.6g}")  # shown live, from rank 0
        # Refused before any rank starts: a folder that would resume past the kill (no rank
        # would die), and a folder another run holds (nothing written into it).
        with pytest.raises(ValueError, match="resume past step 3 and no rank would be killed"):
            kill_switch(cluster, saved("a"), reference, rank=1, at_step=3, interactive=False)
        with CheckpointLock(tmp_path / "c"), pytest.raises(CheckpointError, match="in use"):
            kill_switch(cluster, saved("c"), reference, rank=1, at_step=3, interactive=False)
        assert [p.name for p in (tmp_path / "c").iterdir()] == ["LOCK"]
        # Interrupting the kernel during a headless run stops that cell, and frees the folder.
        interrupted = KillSwitch(cluster, saved("d"), reference, rank=1, at_step=5, pace_s=0.5)

        def interrupt():
            while not interrupted.steps_seen:
                time.sleep(0.02)
            os.kill(os.getpid(), signal.SIGINT)

        threading.Thread(target=interrupt, daemon=True).start()
        with pytest.raises(KeyboardInterrupt):
            interrupted.start(background=False)
        CheckpointLock(tmp_path / "d").take().release()

        clicked = kill_switch(cluster, saved("b"), reference, rank=1, at_step=5, pace_s=0.3)
        deadline = time.monotonic() + 60
        while clicked.steps_seen.get(0, 0) < 1 and time.monotonic() < deadline:
            time.sleep(0.02)  # the kernel is free while the run goes on
        clicked.box.ranks.value = 0
        clicked.box.button.click()
        recovery = clicked.result(timeout=120)
        assert recovery.rank == 0 and "rank 0" in recovery.error and recovery.failed_after < 5
        assert recovery.report.losses == reference.losses
        assert clicked.box.button.disabled and clicked.box.plot.outputs
        assert "run complete" in clicked.box.status.value
        ranks = {r["pid"] for r in cluster.ranks}
        assert descendants() == ranks | {cluster._procs.zygote.pid}  # no orphan
