"""``profile=DIR``: a ``torch.profiler`` trace of each rank's timed steps, one Chrome trace
JSON per rank (``DIR/rank{r}.pt.trace.json``), the file a practitioner opens in Perfetto
(ui.perfetto.dev) or TensorBoard (``tensorboard --logdir DIR``).

The profiler runs over the steps the report's step time is taken from
(``labkit/training/report.py``: ``timed_steps``) and skips the rest with its schedule: the
first step (lazy set-up) and the memory-tracked ones, the last of them serving as the
profiler's own warm-up (under a memory cap every step is tracked, and all but the first are
timed). ``export_chrome_trace`` writes the trace, rather than
``tensorboard_trace_handler``, whose file names carry a host, a pid and a timestamp: a fixed
name per rank is one the report can list and a learner can find, and the
``.pt.trace.json`` ending is the one TensorBoard's profiler plugin looks for.
"""

from __future__ import annotations

import os
import re
import warnings
from contextlib import contextmanager
from pathlib import Path

from labkit.runtime.folders import check_can_be_a_folder

TRACE_NAME = "rank{rank}.pt.trace.json"
TRACE_FILE = re.compile(r"^rank(\d+)\.pt\.trace\.json$")


def trace_path(folder: str, rank: int) -> str:
    """Where rank ``rank`` writes its trace in ``folder``."""
    return os.path.join(folder, TRACE_NAME.format(rank=rank))


def check_profile_dir(folder) -> str:
    """``folder`` as the ranks receive it (``~`` expanded, absolute), made now; ValueError,
    saying what to change, for a folder no rank could write its trace to."""
    if not isinstance(folder, (str, os.PathLike)):
        raise TypeError(f"profile must be a folder's path, got {folder!r}")
    if not os.fspath(folder).strip():
        raise ValueError("profile='' names no folder: give the folder the traces go to, "
                         "e.g. profile='traces'")
    root = Path(os.path.abspath(os.path.expanduser(os.fspath(folder))))
    check_can_be_a_folder(root, "profile folder")
    root.mkdir(parents=True, exist_ok=True)
    return str(root)


def profiled_steps(start: int, steps: int, tracked_until: int) -> range:
    """The steps the report times: after the memory-tracked ones, else all but the first."""
    if tracked_until < steps:
        return range(max(start, tracked_until), steps)
    return range(max(start, min(1, steps - 1)), steps)


def remove_other_ranks_traces(folder: str, world_size: int) -> None:
    """Delete the traces in ``folder`` of ranks a ``world_size``-rank run does not have (an
    earlier run's, on more ranks): TensorBoard and HTA read every trace in a folder, and
    would mix two runs."""
    for name in os.listdir(folder):
        match = TRACE_FILE.match(name)
        if match and int(match.group(1)) >= world_size:
            os.remove(os.path.join(folder, name))


class _NoProfile:
    def step(self) -> None:
        pass


@contextmanager
def rank_profiler(folder: str | None, rank: int, device_type: str, start: int, steps: int,
                  tracked_until: int, world_size: int = 1):
    """A profiler over this rank's steps ``start..steps`` (its ``step()`` called after each)
    that records ``profiled_steps`` and writes them to ``trace_path(folder, rank)``; a
    profiler that does nothing without ``folder``. Yields it; ``.path`` is the trace's.
    Rank 0 first deletes the traces of ranks this run does not have."""
    if folder is None or start >= steps:
        yield _NoProfile()
        return
    if rank == 0:
        remove_other_ranks_traces(folder, world_size)
    from torch.profiler import ProfilerActivity, profile, schedule

    timed = profiled_steps(start, steps, tracked_until)
    warmup = 1 if timed.start > start else 0  # the step before: the profiler's warm-up
    activities = [ProfilerActivity.CPU]
    if device_type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    path = trace_path(folder, rank)
    with warnings.catch_warnings():  # a one-step run has no step before its timed one
        warnings.filterwarnings("ignore", "Profiler won't be using warmup")
        steps = schedule(skip_first=timed.start - start - warmup, wait=0, warmup=warmup,
                         active=len(timed), repeat=1)
    prof = profile(activities=activities, record_shapes=False, schedule=steps,
                   on_trace_ready=lambda p: p.export_chrome_trace(path))
    prof.path = path
    with prof:
        yield prof
