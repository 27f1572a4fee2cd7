"""Show a labkit function's source in a notebook: the lesson reads the code that runs."""

from __future__ import annotations

import inspect


def show_source(obj):
    """The source of ``obj`` (a function or class), highlighted, as it is in labkit."""
    from IPython.display import Code

    return Code(inspect.getsource(obj), language="python")
