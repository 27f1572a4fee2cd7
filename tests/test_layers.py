"""labkit's layers, from its own imports (those inside functions included): each package
imports only the layers below it, and no two packages import each other, even by way of
others. ``docs/architecture.md`` draws the layers."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
LABKIT = REPO / "labkit"
LAYERS = ["runtime", "models", "parallel", "training", "plan", "lessons", "classroom"]


def _python(code: str) -> str:
    """What a fresh Python in this checkout prints for ``code``."""
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def _module(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """module -> the labkit modules it imports (a name imported from a package counts as the
    package's submodule when there is one). Relative imports count, and so does a string that
    names a labkit module (``importlib.import_module("labkit....")``, a list to preload)."""
    modules = {_module(p): p for p in LABKIT.rglob("*.py")}
    found: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text())):
            for target in _targets(node, name, path):
                while target not in modules and "." in target:
                    target = target.rsplit(".", 1)[0]
                if target in modules and target != name:
                    found[name].add(target)
    return found


def _targets(node: ast.AST, name: str, path: Path) -> list[str]:
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
        module = node.module if not node.level else ".".join(filter(None, [base, node.module]))
        return [module, *(f"{module}.{a.name}" for a in node.names)]
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        if node.value.startswith("labkit.") and node.value.replace(".", "").isidentifier():
            return [node.value]
    return []


def _package(module: str) -> str:
    """The folder a module lives in (a package's ``__init__`` is in its own folder)."""
    path = LABKIT.parent / module.replace(".", "/")
    return module if path.is_dir() else module.rsplit(".", 1)[0]


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


def test_labkit_has_at_most_ten_names_at_its_top_level():
    names = sorted(p.name for p in LABKIT.iterdir() if p.name != "__pycache__")
    assert len(names) <= 10, names
    assert set(LAYERS) <= {p.name for p in LABKIT.iterdir() if p.is_dir()}


def test_no_import_climbs_a_layer():
    climbs = [f"{a} imports {b}" for a, targets in _imports().items() for b in targets
              if _layer(a) is not None and _layer(b) is not None and _layer(b) > _layer(a)]
    assert not climbs, "\n".join(sorted(climbs))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one package (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []
    sys.setrecursionlimit(10_000)

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph.get(node, ()):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in list(graph):
        if node not in index:
            visit(node)
    return found


def test_no_two_packages_import_each_other():
    """Sibling packages, and a package and its subpackage too (``runtime/doctor.py`` once
    imported ``runtime/cluster/``, whose launcher imports ``runtime/meshes.py``)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for a, targets in _imports().items():
        for b in targets:
            pa, pb = _package(a), _package(b)
            if pa != pb and "labkit" not in (pa, pb):  # the door sits above every layer
                graph[pa].add(pb)
    assert not _cycles(graph), _cycles(graph)


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


@pytest.mark.parametrize("code", [
    "import labkit",
    "import labkit.runtime.cluster.rank",
    "import labkit.__main__",
])
def test_a_rank_and_the_command_line_never_import_matplotlib(code):
    probe = f"{code}; import sys; print(sorted(m for m in sys.modules if m.split('.')[0] in " \
            "('matplotlib', 'ipywidgets', 'IPython')))"
    out = _python(probe)
    assert out.strip() == "[]", out


def test_import_labkit_after_torch_takes_under_half_a_second():
    probe = ("import time, torch; t = time.perf_counter(); import labkit; "
             "print(time.perf_counter() - t)")
    seconds = min(float(_python(probe)) for _ in range(3))
    assert seconds < 0.5, seconds


def test_the_public_api_is_small_and_every_name_loads():
    import labkit

    assert 8 <= len(labkit.__all__) <= 16, labkit.__all__
    for name in dir(labkit):
        assert getattr(labkit, name) is not None, name


_THREADS_PROBE = """
import sys, threading, torch, labkit
names = [n for n in dir(labkit) if not n.startswith("_")] * 2
start, failed = threading.Barrier(len(names)), []
def load(name):
    start.wait()
    try:
        getattr(labkit, name)
    except Exception as error:  # noqa: BLE001 - reported below
        failed.append(f"{name}: {type(error).__name__}: {error}")
threads = [threading.Thread(target=load, args=(name,)) for name in names]
for thread in threads: thread.start()
for thread in threads: thread.join()
print(failed)
"""


def test_names_loaded_from_several_threads_at_once_all_load():
    """A widget works off the kernel's thread: its first use of a name may meet another's."""
    for _ in range(2):  # without the lock in labkit/__init__.py, one run in two or more fails
        out = _python(_THREADS_PROBE)
        assert out.strip() == "[]", out


def test_a_misspelled_or_dotted_name_is_an_attribute_error_that_imports_nothing():
    probe = ("import sys, labkit; before = set(sys.modules)\n"
             "for name in ('Clusterr', 'trian', 'runtime.cluster', 'lessons.plots'):\n"
             "    try: getattr(labkit, name); print('found', name)\n"
             "    except AttributeError: pass\n"
             "print(sorted(set(sys.modules) - before))")
    out = _python(probe)
    assert out.strip() == "[]", out


def test_a_lesson_module_s_figure_shows_in_a_kernel_without_labkit_plots():
    """A notebook that imports one lesson's plots (not ``labkit.plots``) still sees a bare
    Figure returned by a cell as an image."""
    probe = ("from IPython.core.interactiveshell import InteractiveShell\n"
             "shell = InteractiveShell.instance()\n"
             "from labkit.lessons.long_context.plots import plot_ring_schedule\n"
             "from matplotlib.figure import Figure\n"
             "figure = Figure(); figure.add_subplot().plot([1, 2])\n"
             "data, _ = shell.display_formatter.format(figure)\n"
             "import sys; print('labkit.lessons.plots' in sys.modules, 'image/png' in data)")
    out = _python(probe)
    assert out.split() == ["False", "True"], out
