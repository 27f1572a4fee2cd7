"""Widgets driven in plain pytest: move a slider, the output changes (quizzes: test_quiz.py)."""

from __future__ import annotations

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

    from labkit.widgets.render import LatestOnly

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
    from labkit.widgets import controls

    assert controls.gpu_count_slider([4, 1, 2]).value == 4
    size = controls.model_size_slider([200_000, 1_000_000])
    assert size.options[0] == ("0.2M params", 200_000) and size.description == "model size"
    assert controls.memory_cap_slider([2**20, 2**30]).options[1][0] == "1 GiB"
    assert controls.strategy_picker().value == "ddp"
    assert controls.micro_batches_slider().options == (1, 2, 4, 8)
