"""Values a notebook computed, written as JSON so that tests can check the lesson's claims.

Each notebook ends with a collapsed cell that calls ``record_results``; it writes nothing in a
learner's session. The test suite starts the notebook's kernel with ``LABKIT_RESULTS`` set to
a file's path (``tests/lessons.py``) and asserts each claim of the prose on what the notebook
really computed.
"""

from __future__ import annotations

import json
import os

RESULTS_ENV = "LABKIT_RESULTS"


def record_results(**values) -> None:
    """Write ``values`` as JSON to the file named by ``$LABKIT_RESULTS`` (unset: nothing)."""
    path = os.environ.get(RESULTS_ENV)
    if path:
        with open(path, "w") as f:
            json.dump(values, f, indent=1, default=_plain)


def _plain(value):
    if hasattr(value, "tolist"):  # tensors and numpy values
        return value.tolist()
    raise TypeError(f"cannot record {type(value).__name__} as JSON")
