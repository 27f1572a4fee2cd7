"""Runs that confirm or refute the claims the quizzes make about distributed training.

Each returns a small result with a table (``_repr_html_``) and plain values (``to_dict``):

* ``taking_turns``: N devices working one after another cost N device-steps for no speedup;
* ``work_per_rank``: data parallelism splits the FLOPs of a step, it does not remove them;
* ``held_out``: one device and N devices reach the same held-out loss (averaging gradients
  keeps training equal, it does not generalise better);
* ``endpoints``: the same data from different starting weights ends at different losses
  (no training setup, distributed or not, promises the global optimum).
"""

from labkit.lessons.data_parallel.endpoints import Endpoints, endpoints
from labkit.lessons.data_parallel.held_out import HeldOut, held_out, held_out_loss
from labkit.lessons.data_parallel.turns import TakingTurns, taking_turns
from labkit.lessons.data_parallel.work import WorkSplit, work_per_rank

__all__ = ["Endpoints", "HeldOut", "TakingTurns", "WorkSplit", "endpoints", "held_out",
           "held_out_loss", "taking_turns", "work_per_rank"]
