"""``%%ranks cluster``: run a notebook cell on every rank of a ``labkit.Cluster``.

    %load_ext labkit

    %%ranks cluster
    total = torch.tensor([float(ctx.rank)])
    dist.all_reduce(total)
    total.item()                      # -> [6.0, 6.0, 6.0, 6.0] on 4 ranks

It is ``cluster.run`` underneath: the cell's source is sent as text to ``run_cell``
(``cells.py``), each rank's prints are shown under ``[rank r]``, a failure raises the
``RankError`` that ``cluster.run`` raises, and Ctrl-C stops the ranks as it stops a run.
The cell sees ``ctx`` (the rank's ``RankContext``), ``torch`` and ``dist``; the names it
defines stay on each rank for the next ``%%ranks`` cell, in ``ctx.state``, until the ranks
restart (after a failure, a stop or a timeout). Plain Python only: no ``%`` or ``!`` lines.
Loaded by ``%load_ext labkit`` (``labkit.load_ipython_extension``); IPython is imported here
and nowhere else.
"""

from __future__ import annotations

import keyword
import weakref

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from labkit.runtime.cluster.cells import compile_cell, run_cell
from labkit.runtime.cluster.cluster import Cluster
from labkit.runtime.cluster.errors import RankError, RunTimeout

FAILURE_NOTE = ("%%ranks: the ranks restart on the next run, and the names that %%ranks "
                "cells defined on them (kept in ctx.state) are gone; run those cells again")


class RanksCells:
    """``%%ranks`` for one notebook namespace ``user_ns``: the magic's work, also for cells
    run outside a kernel (the grader's checker, ``labkit/classroom/checker.py``)."""

    def __init__(self, user_ns: dict):
        self.user_ns = user_ns
        # Clusters that ran a %%ranks cell: a NameError in a new namespace on their ranks
        # then says that the ranks restarted.
        self._ran = weakref.WeakKeyDictionary()

    def run(self, line: str, cell: str, execution_count: int = 1):
        """Run ``cell`` on every rank of the cluster ``line`` names; the ranks' values of
        its last expression in rank order (None when it has none, or all are None)."""
        args = parse_argstring(RanksMagics.ranks, line)
        if args.out is not None and (not args.out.isidentifier() or keyword.iskeyword(args.out)):
            raise UsageError(f"%%ranks --out {args.out}: {args.out!r} is not a Python name; "
                             "give a name such as --out values")
        cluster = self._cluster(args.cluster)
        filename = f"<%%ranks cell {execution_count}>"
        _, last = compile_cell(cell, filename)  # a SyntaxError is raised here, nothing sent
        try:
            answers = cluster.run(run_cell, f"%%ranks {line}", cell, filename,
                                  cluster in self._ran, timeout=args.timeout)
        except (RankError, RunTimeout) as error:
            if getattr(error, "restarted", True):  # a result not rebuilt leaves them up
                error.add_note(FAILURE_NOTE)
            # The rank's traceback is in the error; labkit's own frames are noise here.
            raise error.with_traceback(None) from error.__cause__
        self._ran[cluster] = True
        if args.out:
            self.user_ns[args.out] = answers
        # As a notebook cell shows nothing for None (a print() last), nothing for all None.
        return None if last is None or all(v is None for v in answers) else answers

    def _cluster(self, name: str) -> Cluster:
        if name not in self.user_ns:
            raise UsageError(f"%%ranks {name}: no {name!r} in the notebook; start one first, "
                             f"e.g. {name} = labkit.Cluster(2)")
        cluster = self.user_ns[name]
        if not isinstance(cluster, Cluster):
            raise UsageError(f"%%ranks {name}: {name} is a {type(cluster).__name__}, not a "
                             "labkit.Cluster")
        return cluster


@magics_class
class RanksMagics(Magics):
    """The ``%%ranks`` cell magic (see the module's docstring)."""

    def __init__(self, shell):
        super().__init__(shell)
        self._cells = RanksCells(shell.user_ns)

    @magic_arguments()
    @argument("cluster", help="the name of a labkit.Cluster in the notebook")
    @argument("--timeout", type=float, default=None,
              help="seconds the cell may run (cluster.run's timeout)")
    @argument("--out", default=None, metavar="NAME",
              help="also store the ranks' values (a list in rank order) in NAME")
    @cell_magic
    def ranks(self, line: str, cell: str):
        """Run this cell on every rank of CLUSTER; the value of its last expression comes
        back as a list in rank order (see labkit/runtime/cluster/magic.py)."""
        # The cell's In[n]: IPython counts it up before it runs the cell.
        return self._cells.run(line, cell, max(self.shell.execution_count - 1, 1))


def load_ipython_extension(ipython) -> None:
    """``%load_ext labkit``: register ``%%ranks``."""
    ipython.register_magics(RanksMagics)
