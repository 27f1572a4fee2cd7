"""A run's progress bar: a run that ran out of memory ends in a neutral colour, saying when."""

from __future__ import annotations

import io
from contextlib import redirect_stdout

from tqdm.notebook import tqdm_notebook

from labkit.runtime.cluster import progress as progress_module
from labkit.runtime.cluster.progress import RunProgress


def test_a_run_out_of_memory_ends_its_bar_neutral_in_the_step_it_failed(monkeypatch):
    bars = []

    def notebook_bar(**kwargs):
        bars.append(tqdm_notebook(**kwargs))
        return bars[-1]

    monkeypatch.setattr(progress_module, "_bar_class", lambda: notebook_bar)
    with redirect_stdout(io.StringIO()):  # outside a notebook the widget prints its repr
        progress = RunProgress(2)
        for rank in (0, 1):
            progress.update(rank, 1, 3, "ddp x2, rank 0 loss 5.7" if rank == 0 else "ddp x2")
        progress.out_of_memory()
        progress.close()
    label, bar, _ = bars[0].container.children
    assert bar.bar_style == "info" and bar.value == 1
    assert "ddp x2: out of memory in step 2" in label.value.replace("\u2007", " ")
