"""Values a notebook computed, written as JSON so that tests can check them."""

from __future__ import annotations

import json
import os


def record_results(path: str | os.PathLike | None, **values) -> None:
    """Write ``values`` to ``path`` as JSON (nothing is written when ``path`` is empty).

    Notebooks end with this call; under papermill the test injects ``results_path`` and
    asserts on what the notebook really computed.
    """
    if path:
        with open(path, "w") as f:
            json.dump(values, f, indent=1, default=_plain)


def _plain(value):
    if hasattr(value, "tolist"):  # tensors and numpy values
        return value.tolist()
    raise TypeError(f"cannot record {type(value).__name__} as JSON")
