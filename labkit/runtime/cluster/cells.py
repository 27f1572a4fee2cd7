"""A notebook cell's source run on a rank: the rank's side of the ``%%ranks`` magic
(``magic.py``).

The cell travels as text, is compiled on the rank under a name of its own (so a traceback
shows the cell's lines) and runs in a namespace kept in ``ctx.state``: names one cell defines
are there for the next, on that rank, until the ranks restart. Like a notebook cell, the
value of a last line that is an expression is the cell's value (the rank's result).
"""

from __future__ import annotations

import ast
import linecache

NAMESPACE_KEY = "labkit.ranks_namespace"  # the key of a rank's cell namespace in ctx.state
RESTARTED_NOTE = ("the ranks restarted since the last %%ranks cell (a run failed, was "
                  "stopped or timed out), so the names earlier %%ranks cells defined are "
                  "gone: run those cells again")


def compile_cell(source: str, filename: str):
    """(code of the cell's statements, code of its last expression or None), numbered as
    the notebook numbers the cell's lines (its first line is the ``%%ranks`` line). Raises
    SyntaxError, in the notebook before anything is sent and on the rank alike."""
    tree = ast.parse("\n" + source, filename, "exec")  # line 1 is the %%ranks line
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec")
    return body, None if last is None else compile(last, filename, "eval")


def _remember_source(header: str, source: str, filename: str) -> None:
    """Let tracebacks on this rank quote the cell's lines (``linecache`` keeps entries
    without a modification time)."""
    lines = [header + "\n", *source.splitlines(keepends=True)]
    linecache.cache[filename] = (len(source), None, lines, filename)


def run_cell(ctx, header: str, source: str, filename: str, names_expected: bool = False):
    """Run a cell's ``source`` (below its ``header``, the ``%%ranks`` line) on this rank;
    return the value of its last expression, or None. ``ctx``, ``torch`` and ``dist`` are
    defined in it.

    ``names_expected``: an earlier ``%%ranks`` cell ran on these ranks' predecessors; a
    NameError from a new namespace then says that the ranks restarted."""
    import torch
    import torch.distributed as dist

    fresh = NAMESPACE_KEY not in ctx.state
    namespace = ctx.state.setdefault(NAMESPACE_KEY, {"__name__": "__ranks__"})
    namespace.update(ctx=ctx, torch=torch, dist=dist)
    _remember_source(header, source, filename)
    body, last = compile_cell(source, filename)
    try:
        exec(body, namespace)  # noqa: S102 - the learner's own cell, on the learner's ranks
        value = None if last is None else eval(last, namespace)  # noqa: S307
    except NameError as error:
        if fresh and names_expected:
            error.args = (f"{error.args[0] if error.args else error}; {RESTARTED_NOTE}",)
        raise
    return value
