"""One run trained twice, by ``labkit.train`` and by the plain PyTorch a lesson shows, and
their losses side by side.

    plain = cluster.run(train_with_ddp, config)      # the lesson's torch-only function
    labkit.lessons.show.same_run.compare_losses(report, plain)

``plain`` is what ``cluster.run`` returned: each rank's list of per-step losses (the loss of
its own slice of the global batch, or NaN on a rank that computes none, as a pipeline's first
stages). The global batch's loss is the mean of the ranks that have one, as
:attr:`labkit.TrainReport.losses` reports it.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass

from labkit.lessons.show.table import html_table

# Two runs of the same arithmetic in the same order agree to the last bit; the same maths
# reduced in another order (a bucket boundary, a pipeline's micro-batch sums) to about 1e-6.
TOLERANCE = 1e-5


def global_losses(per_rank: list[list[float]]) -> list[float]:
    """The mean, over the ranks that report one, of each step's loss."""
    steps = {len(losses) for losses in per_rank}
    if len(steps) != 1:
        raise ValueError(f"the ranks ran different numbers of steps: {sorted(steps)}")
    return [statistics.fmean([v for v in step if not math.isnan(v)])
            for step in zip(*per_rank, strict=True)]


@dataclass(frozen=True)
class SameRun:
    """The two runs' losses, per step, and whether they agree within :data:`TOLERANCE`."""

    name: str
    labkit: list[float]
    plain: list[float]

    @property
    def max_difference(self) -> float:
        return max(abs(a - b) for a, b in zip(self.labkit, self.plain, strict=True))

    @property
    def equal(self) -> bool:
        return len(self.labkit) == len(self.plain) and all(
            math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)
            for a, b in zip(self.labkit, self.plain, strict=True))

    def summary(self) -> str:
        verdict = "equal" if self.equal else "DIFFERENT"
        return (f"{self.name}: labkit.train and plain PyTorch, {len(self.plain)} steps: "
                f"losses {verdict} (largest difference {self.max_difference:.1e})")

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        rows = [[step, f"{a:.6f}", f"{b:.6f}", f"{abs(a - b):.1e}"]
                for step, (a, b) in enumerate(zip(self.labkit, self.plain, strict=True))]
        return html_table(self.summary(), ["step", "labkit.train", "plain PyTorch",
                                           "difference"], rows)


@dataclass(frozen=True)
class AwaitingAnswer:
    """In place of a :class:`SameRun` whose plain run calls an exercise's answer that is not
    written yet (it still raises NotImplementedError): says so, and records nothing."""

    name: str
    answer: tuple[str, ...]
    labkit = plain = max_difference = equal = None

    def summary(self) -> str:
        names = " and ".join(f"`{name}`" for name in self.answer)
        return (f"{self.name}: not run yet. This run calls your {names} from the exercise "
                "above, which still raises NotImplementedError: write "
                f"{'it' if len(self.answer) == 1 else 'them'}, run the exercise's cell, then "
                "run this one again.")

    def __str__(self) -> str:
        return self.summary()

    def _repr_html_(self) -> str:
        return f"<i>{html.escape(self.summary())}</i>"


def compare_losses(report, plain, name: str = "the same run",
                   answer: str | tuple[str, ...] | None = None) -> SameRun | AwaitingAnswer:
    """``report``: a :class:`labkit.TrainReport` (or a list of losses); ``plain``: what
    ``cluster.run`` returned for the plain PyTorch function (each rank's losses). Raises
    ValueError when the two ran different numbers of steps.

    ``answer``: the name (or names) of the exercise's functions the plain run calls;
    ``plain`` is then a function of no arguments that starts the run (``lambda:
    cluster.run(fn, config)``), and while an answer still raises NotImplementedError on the
    ranks the result is an
    :class:`AwaitingAnswer`. Any other error is raised as it is."""
    if answer is not None:
        from labkit.runtime.cluster.errors import RankError

        try:
            plain = plain()
        except RankError as error:
            if not isinstance(error.exception, NotImplementedError):
                raise
            return AwaitingAnswer(name, (answer,) if isinstance(answer, str) else answer)
    ours = list(report.losses) if hasattr(report, "losses") else list(report)
    theirs = global_losses([list(losses) for losses in plain])
    if len(ours) != len(theirs):
        raise ValueError(f"labkit.train ran {len(ours)} steps and the plain run "
                         f"{len(theirs)}: give both the same config")
    return SameRun(name, ours, theirs)
