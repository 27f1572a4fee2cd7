"""The kill button: a checkpointed run in progress on the ranks, a "kill rank R" button that
SIGKILLs that rank's process while it trains, live progress (step, loss), then the recovery
(the cluster replaces the dead rank, ``train`` resumes from the newest checkpoint) and the
loss curve with the lost steps shaded.

The run goes in a background thread, so the kernel stays free to take the click. If nobody
clicks, rank ``rank`` is killed after ``at_step`` steps by the same ``kill`` the button calls:
that rank waits after that step (before its save) until the notebook's kill lands, so a
headless run (papermill, ``interactive=False``: the same code, in the calling thread) fails at
a known step.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
import warnings

from labkit.lessons.checkpoints.failures import Recovery, check_failure
from labkit.runtime.cluster import RankError, RanksRestartedWarning
from labkit.training.api import checked
from labkit.training.checkpoint.lock import CheckpointLock
from labkit.training.checkpoint.rules import check_checkpointing

WAIT_FOR_KILL_S = 60.0  # a rank waiting to be killed gives up (an error) after this long
_LOSS = re.compile(r"loss (\S+)")


def _train_until_killed(ctx, run_dict: dict, rank: int, at_step: int, pace_s: float) -> dict:
    """On every rank: train, each step reported at once (no throttling) so the notebook sees
    it; rank ``rank`` waits after ``at_step`` steps until the notebook kills it."""
    from labkit.training.loop import train_on_rank

    report = ctx.progress

    def progress(done: int, total: int, desc: str = "") -> None:
        ctx._last_progress = 0.0  # the notebook acts on each step: never drop one
        report(done, total, desc)
        if ctx.rank == rank and done == at_step:
            time.sleep(WAIT_FOR_KILL_S)
            raise RuntimeError(f"rank {rank} waited {WAIT_FOR_KILL_S:.0f} s after step "
                               f"{at_step} and nobody killed it")
        if pace_s and done < total:
            time.sleep(pace_s)  # time to click; outside the step, so not in its step_s

    ctx.progress = progress
    try:
        return train_on_rank(ctx, run_dict)
    finally:
        ctx.__dict__.pop("progress", None)


class KillSwitch:
    """A checkpointed run with a kill button; ``result()`` waits for the ``Recovery``."""

    def __init__(self, cluster, config, reference=None, rank: int = 1, at_step: int = 1,
                 pace_s: float = 0.0):
        check_failure(cluster, config, rank, at_step, "kill")
        self.run = checked(cluster, config)  # "~/ckpt" absolute: where the recovery looks
        _check_not_resumed_past(self.run, at_step)
        self.cluster, self.config, self.reference = cluster, self.run.config, reference
        self.rank, self.at_step, self.pace_s = rank, at_step, pace_s
        self.steps_seen: dict[int, int] = {}  # rank -> steps it reported done
        self.losses: dict[int, float] = {}  # step -> loss, as rank 0 reported it
        self.killed: tuple[int, int] | None = None  # (rank, steps it had done)
        self.recovery: Recovery | None = None
        self.error: BaseException | None = None
        self.figure = None
        self._kill_lock = threading.Lock()
        self._live = False  # the run to kill is on the ranks now (a click may act)
        self._started = False
        self._lock: CheckpointLock | None = None  # the folder, held during the first run
        self._thread: threading.Thread | None = None
        self.box = None

    # ----- what the button and the headless path call -----------------------------------
    def kill(self, rank: int) -> bool:
        """SIGKILL rank ``rank``'s process now (once per run); False if too early (no step
        reported yet), too late (the run over: its ranks are idle, or another run's, and a
        pid may have been reused) or done already."""
        if not 0 <= rank < self.cluster.world_size:
            raise ValueError(f"rank must be in 0..{self.cluster.world_size - 1}, got {rank}")
        with self._kill_lock:
            if not self._live or self.killed is not None or not self.steps_seen:
                return False  # one kill per run, while it trains (before: the old ranks)
            pid = self.cluster.ranks[rank].get("pid")
            if pid is None:  # still starting: nothing to kill yet
                return False
            # Recorded before the signal: the run's thread may see the rank die before this
            # thread runs again (or a kernel interrupt lands here), and must know it was us.
            self.killed = (rank, self.steps_seen.get(rank, 0))
            try:
                os.kill(pid, signal.SIGKILL)  # no goodbye, as when a GPU falls off the bus
            except ProcessLookupError:  # already gone: the run is failing anyway
                self.killed = None
                return False
        self._say(f"<b>rank {rank} killed</b> after {self.killed[1]} steps; the others wait "
                  "in their next collective until the cluster notices")
        return True

    def _on_progress(self, rank: int, done: int, total: int, desc: str) -> None:
        self.steps_seen[rank] = done
        match = _LOSS.search(desc)
        if rank == 0 and match:
            self.losses[done] = float(match.group(1))
        if self.killed is None and rank == self.rank and done == self.at_step:
            self.kill(rank)  # nobody clicked in time: the planned failure
        phase = "recovering" if self.killed else "training"
        loss = (f", rank 0's loss {self.losses[done]:.4f}" if rank == 0 and done in self.losses
                else "")
        if rank == 0:
            self._say(f"{phase}: step {done}/{total}{loss}", progress=(done, total))

    # ----- the run ----------------------------------------------------------------------
    def _run(self) -> None:
        import labkit

        bar = self.cluster.progress
        self.cluster.progress = bar and self.box is None  # the widget has its own bar
        try:
            with self.cluster.listening(self._on_progress):
                try:
                    self._live = True
                    self.cluster.run(_train_until_killed, self.run.to_dict(), self.rank,
                                     self.at_step, self.pace_s)
                    raise RuntimeError("the run finished: no rank was killed")
                except RankError as exc:
                    if self.killed is None:
                        raise
                    error = f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
                finally:  # the recovery's train takes the folder itself
                    with self._kill_lock:  # no click acts on the ranks from now on
                        self._live = False
                    self._lock.release()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RanksRestartedWarning)  # we killed it
                    report = labkit.train(self.cluster, self.run, estimate=False)
            rank, done = self.killed
            self.recovery = Recovery(rank, "kill", done, report.ranks[0]["resumed_at"], error,
                                     report)
            self._finish()
        except BaseException as exc:  # noqa: BLE001 - shown in the widget, raised by result()
            self.error = exc
            self._say(f"<span style='color:firebrick'>{type(exc).__name__}: {exc}</span>")
        finally:
            self.cluster.progress = bar

    def _finish(self) -> None:
        from labkit.lessons.checkpoints.plots import plot_recovery

        self.figure = plot_recovery(self.recovery, self.reference)
        self._say(f"resumed from the checkpoint of step {self.recovery.resumed_at}: "
                  f"{self.recovery.lost_steps} steps lost and done again; run complete")
        if self.box is not None:
            from labkit.lessons.show.render import show_figure

            show_figure(self.box.plot, self.figure)

    def start(self, background: bool = True) -> KillSwitch:
        if self._started:  # its steps, kill and recovery belong to the run it made
            raise RuntimeError("a KillSwitch runs once: make another (kill_switch(...)) with "
                               "a fresh checkpoint_dir")
        self._started = True
        # the folder is this run's from now (CheckpointError at once if another run holds it)
        self._lock = CheckpointLock(self.config.checkpoint_dir).take()
        if not background:
            self._run()
            if isinstance(self.error, KeyboardInterrupt):
                raise self.error  # the kernel's interrupt stops the cell, not a later one
            return self
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def result(self, timeout: float | None = None) -> Recovery:
        """Wait for the run and its recovery; the ``Recovery`` (or the run's error)."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the run was still going after {timeout} s")
        if self.error is not None:
            raise self.error
        return self.recovery

    # ----- showing ----------------------------------------------------------------------
    def _say(self, html_text: str, progress: tuple[int, int] | None = None) -> None:
        if self.box is None:
            return
        self.box.status.value = html_text
        if progress is not None:
            self.box.bar.max, self.box.bar.value = progress[1], progress[0]
        self.box.button.disabled = (not self._live or self.killed is not None
                                    or not self.steps_seen)

    def build_box(self):
        import ipywidgets as widgets

        ranks = widgets.Dropdown(options=list(range(self.cluster.world_size)), value=self.rank,
                                 description="rank")
        button = widgets.Button(description="kill rank", button_style="danger", icon="skull")
        button.on_click(lambda _: self.kill(ranks.value))
        button.disabled = True  # until the run reports its first step
        bar = widgets.IntProgress(value=0, max=self.config.steps, description="step")
        self.box = widgets.VBox([widgets.HBox([ranks, button, bar]), widgets.HTML(),
                                 widgets.Output()])
        self.box.ranks, self.box.button, self.box.bar = ranks, button, bar
        self.box.status, self.box.plot = self.box.children[1], self.box.children[2]
        self.box.status.value = (f"starting; rank {self.rank} dies after {self.at_step} steps "
                                 "unless you kill a rank first")
        return self.box

    def _repr_mimebundle_(self, **kwargs):
        if self.box is not None:
            return self.box._repr_mimebundle_(**kwargs)
        return None  # headless: the figure's own repr shows it

    def _repr_png_(self):
        if self.box is None and self.figure is not None:
            from labkit.lessons.show.display import figure_png

            return figure_png(self.figure)
        return None


def _check_not_resumed_past(run, at_step: int) -> None:
    """Before anything runs: a folder that already holds this run's checkpoint of step
    ``at_step`` or later resumes past the kill, and no rank would die."""
    config = run.config
    found = check_checkpointing(run)
    if found is not None and found.step >= at_step:
        raise ValueError(f"checkpoint_dir {str(config.checkpoint_dir)!r} already holds this "
                         f"run's checkpoint after {found.step} steps: the run would resume "
                         f"past step {at_step} and no rank would be killed: give a fresh "
                         f"checkpoint_dir")


def kill_switch(cluster, config, reference=None, rank: int = 1, at_step: int = 1,
                interactive: bool = True, pace_s: float | None = None) -> KillSwitch:
    """Start ``config`` (which has a ``checkpoint_dir``) on ``cluster`` with a kill button.
    Interactive: a widget, the run in a background thread, paced (``pace_s`` a step, default
    0.25 s) so there is time to click. Headless: the run, failure and recovery done before it
    returns, the figure its display."""
    switch = KillSwitch(cluster, config, reference, rank, at_step,
                        (0.25 if interactive else 0.0) if pace_s is None else pace_s)
    if interactive:
        switch.build_box()
    return switch.start(background=interactive)
