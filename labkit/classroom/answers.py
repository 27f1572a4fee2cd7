"""A learner's answer cells, run on the ranks only: how the grader's checker calls them.

The checker (``checker.py``) never executes a learner's cell in its own process. For each name
an answer cell defines (``def ring_all_reduce``, a class), it binds an ``Answer``: a small
object that a check hands to ``cluster.run`` like the function itself. It travels to the ranks
as text (the answer cells' sources and the names of the modules the notebook imported), and on
a rank, at its first call, the sources are executed there and the call goes to the learner's
function. Whatever the cell does at module level (replace ``labkit.check``, patch builtins or
the display) happens on a rank, never where the verdict is computed.
"""

from __future__ import annotations

import ast
import hashlib
import importlib
import os
import re

_EXECUTED: dict[str, dict] = {}  # on a rank: the answers' namespaces, by their sources' hash
_IN_CHECKER = False  # True in the checker's own process (mark_checker_process)


# What an answer has no need of, and a forgery does: labkit's checks and their counters (some
# of a check's measurements are made on the ranks, where the answer runs), and ways to reach
# them indirectly; and labkit's own parallelisms and training engines (its tensor-parallel
# plans, its FSDP and ZeRO), which do what an exercise asks the learner to write with torch.
# The notebooks hand out a few of labkit's pieces in an answer cell's given code (04: Megatron's
# f and g as autograd functions); importing those alone is not flagged.
GIVEN = {("labkit.parallel.tensor", "copy_to_parallel_region"),
         ("labkit.parallel.tensor", "reduce_from_parallel_region")}
_LABKIT = r"check|comm|classroom|cluster|lessons|runtime|parallel|training|train|script|models"
SUSPECT = re.compile(rf"labkit\.(?:{_LABKIT})[\w.]*|"
                     r"\b(?:gc|inspect|importlib|ctypes|builtins)\b|_getframe|"
                     r"\bf_(?:locals|back|globals)\b|__import__|sys\.modules|\bTraffic\b|"
                     rf"\bCollectiveMeter\b|from\s+labkit\s+import[^\n]*\b(?:{_LABKIT})\b")


def review_notes(source: str) -> list[str]:
    """What in an answer cell an instructor should read before trusting its points: much of
    what a check measures is measured on the ranks, in the learner's process (not the ring
    check's inputs and bytes: ``labkit/lessons/exercise/outside.py``), so an answer that
    reaches into labkit's checks or counters (or into frames, modules, the garbage
    collector) can make them see what it wants; and an answer that calls labkit's own
    parallelisms or training (``labkit.parallel``, ``labkit.train``) passes an exercise
    without writing the torch code it asks for. A flag, never a verdict; an obfuscated
    forgery can avoid it."""
    return list(dict.fromkeys(SUSPECT.findall(_without_given_imports(source))))


def _without_given_imports(source: str) -> str:
    """``source`` less its ``from labkit... import`` statements that import only ``GIVEN``
    names (unchanged if it does not parse)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source
    lines = source.splitlines(keepends=True)
    for node in reversed(tree.body):
        if isinstance(node, ast.ImportFrom) and node.names and all(
                (node.module, alias.name) in GIVEN and alias.asname in (None, alias.name)
                for alias in node.names):
            lines[node.lineno - 1:node.end_lineno] = ["\n"]
    return "".join(lines)


class AnswerOnHost(RuntimeError):
    """An answer was called in the checker's own process (it runs on the ranks only)."""


def defined_names(source: str) -> list[str]:
    """The top-level names a cell defines (functions, classes, assignments); [] if it does
    not parse (the error then shows on the ranks, where it is executed)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names += [t.id for t in targets if isinstance(t, ast.Name)]
    return list(dict.fromkeys(names))


class Answer:
    """``name`` as defined by the answer cells ``sources`` (executed in order, on a rank, in a
    namespace holding the notebook's imported ``modules``: {name: module name})."""

    def __init__(self, name: str, sources: tuple[str, ...], modules: dict[str, str]):
        self.name, self.sources, self.modules = name, tuple(sources), dict(modules)
        self.__name__ = self.__qualname__ = name

    def __repr__(self) -> str:
        return f"<the learner's {self.name}, run on the ranks>"

    def resolve(self):
        """The learner's object on this rank (its cells executed here once)."""
        if _IN_CHECKER:
            raise AnswerOnHost(f"{self.name} runs on the ranks only, not in the grader")
        key = hashlib.sha256("\0".join(self.sources).encode()).hexdigest()
        if key not in _EXECUTED:
            namespace = {"__name__": "__main__"}
            namespace.update({alias: importlib.import_module(module)
                              for alias, module in self.modules.items()})
            _EXECUTED[key] = namespace
            for n, source in enumerate(self.sources):
                exec(compile(source, f"<answer cell {n + 1}>", "exec"), namespace)  # noqa: S102
        namespace = _EXECUTED[key]
        if self.name not in namespace:
            raise NameError(f"name {self.name!r} is not defined: the answer cell must define "
                            f"{self.name} (keep the name the notebook gave it)")
        return namespace[self.name]

    def __call__(self, *args, **kwargs):
        return self.resolve()(*args, **kwargs)


def mark_checker_process() -> None:
    """Called once by the checker: an ``Answer`` called in this process refuses to run.
    Ranks forked from it later run answers as usual (``os.register_at_fork`` resets it)."""
    global _IN_CHECKER
    _IN_CHECKER = True


def _reset_after_fork() -> None:
    global _IN_CHECKER
    _IN_CHECKER = False


os.register_at_fork(after_in_child=_reset_after_fork)
