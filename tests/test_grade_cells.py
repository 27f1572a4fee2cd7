"""The grader runs a course notebook's cells in its checker and the answer cells on the ranks
only (docs/instructor.md, "What runs"): a cell outside the answers that uses a module which
only an answer cell imports works in a learner's kernel and fails in the grader, costing an
honest learner the points of every check after it."""

from __future__ import annotations

import ast
import builtins

import nbformat
import pytest

from tests.lessons import COURSE, STEMS


def _parsed(source: str) -> ast.Module | None:
    code = "\n".join(line for line in source.splitlines()
                     if not line.lstrip().startswith(("%", "!")))  # magics: not Python
    try:
        return ast.parse(code)
    except SyntaxError:
        return None


def _imported(tree: ast.Module) -> set[str]:
    return {(alias.asname or alias.name).split(".")[0] for node in ast.walk(tree)
            if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names}


def _bound(tree: ast.Module) -> set[str]:
    names = _imported(tree)
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
    return names


def _unbound_loads(tree: ast.Module) -> set[str]:
    """Names a cell loads that it does not bind where they are loaded: the cell's top level
    sees its top-level bindings only (an import inside a function binds nothing outside
    it); a function's body sees those and its own."""
    functions = [node for node in ast.walk(tree)
                 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))]
    inner = {id(node) for function in functions for node in ast.walk(function)}
    top_nodes = [node for node in ast.walk(tree) if id(node) not in inner]
    top_bound = {(a.asname or a.name).split(".")[0] for node in top_nodes
                 if isinstance(node, (ast.Import, ast.ImportFrom)) for a in node.names}
    top_bound |= {node.id for node in top_nodes
                  if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)}
    top_bound |= {f.name for f in functions if not isinstance(f, ast.Lambda)}
    missing = {node.id for node in top_nodes
               if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)} - top_bound
    for function in functions:
        loaded = {node.id for node in ast.walk(function)
                  if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}
        missing |= loaded - top_bound - _bound(function)
    return missing


def modules_only_answers_import(notebook) -> list[tuple[int, list[str]]]:
    """(cell index, module names) of the cells outside the answers that load a module name
    that, at that point, only an answer cell has imported."""
    outside, answers_only, found = set(dir(builtins)), set(), []
    for index, cell in enumerate(notebook.cells):
        tree = _parsed(cell.source) if cell.cell_type == "code" else None
        if tree is None:
            continue
        if cell.metadata.get("nbgrader", {}).get("solution", False):
            answers_only |= _imported(tree) - outside
            continue
        missing = sorted(_unbound_loads(tree) & answers_only)
        if missing:
            found.append((index, missing))
        outside |= _bound(tree)
        answers_only -= outside
    return found


@pytest.mark.parametrize("stem", STEMS)
def test_cells_outside_the_answers_import_what_they_use(stem):
    notebook = nbformat.read(COURSE / f"{stem}.ipynb", as_version=4)
    assert modules_only_answers_import(notebook) == []


def test_a_module_only_an_answer_imports_is_found():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("import torch\ndef f(x):\n    return torch.ones(x)",
                                  metadata={"nbgrader": {"solution": True}}),
        nbformat.v4.new_code_cell("check(f)"),  # the answer's function: the grader's to bind
        nbformat.v4.new_code_cell("def g():\n    return torch.zeros(1)"),
        nbformat.v4.new_code_cell("def h():\n    import torch\nprint(torch.ones(1))"),
        nbformat.v4.new_code_cell("import torch\ntorch.ones(1)")])
    assert modules_only_answers_import(notebook) == [(2, ["torch"]), (3, ["torch"])]
