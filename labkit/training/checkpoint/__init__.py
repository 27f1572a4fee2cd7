"""Sharded checkpoints of a training run with ``torch.distributed.checkpoint`` (DCP), and
exact resumption (``labkit.train(..., checkpoint_dir=d, checkpoint_every=k)``).

``store.py``: the folders on disk, which can be trusted, the atomic commit; ``state.py``:
what each rank saves (model and optimizer through torch's state-dict helpers, RNG);
``session.py``: save and resume on the ranks; ``rules.py``: checks before any rank starts;
``lock.py``: one run at a time in a checkpoint folder. Every layout checkpoints, and DCP
reshards a checkpoint to another layout or rank count (``state.py`` says how).
"""

from labkit.training.checkpoint.rules import check_checkpointing
from labkit.training.checkpoint.session import Checkpointer
from labkit.training.checkpoint.store import CheckpointError, CheckpointWarning, scan

__all__ = ["CheckpointError", "CheckpointWarning", "Checkpointer", "check_checkpointing",
           "scan"]
