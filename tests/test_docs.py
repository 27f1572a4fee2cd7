"""The course's web site (``python -m labkit docs``), built with ``mkdocs build --strict`` from
the lessons this session executed at their classroom defaults (``tests/built_site.py``): every
lesson has its page with its plots and as the learner's copy shows it (no solution's code, no
check's verdict), the figures are there, an API page holds a real docstring, a broken link
fails the build, and the command's own errors come before anything slow."""

from __future__ import annotations

import ast
import re
from html.parser import HTMLParser
from pathlib import Path

import nbformat
import pytest

from labkit.__main__ import main
from labkit.classroom import site as site_module
from labkit.classroom.lesson_pages import CHECK_NOTE, PageError, colab_url, lesson_page
from labkit.classroom.release import release_notebook
from labkit.classroom.site import SiteError, mkdocs_build
from labkit.classroom.widget_snapshots import WIDGET_MIME, widget_state
from tests.built_site import SITE_TIMEOUT_S, built_site
from tests.lessons import COURSE, REPO, STEMS, lesson

pytestmark = pytest.mark.timeout(SITE_TIMEOUT_S)


@pytest.fixture(scope="module")
def site() -> Path:
    return built_site()


class _Page(HTMLParser):
    """A page's text (scripts and styles left out) and its images' sources."""

    def __init__(self, path: Path | None = None, markup: str = ""):
        super().__init__()
        self.text, self.images, self.links, self._skip = [], [], [], 0
        self.feed(path.read_text() if path else markup)

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._skip += tag in ("script", "style")
        if tag == "img":
            self.images.append(attrs.get("src", ""))
        if tag == "a":
            self.links.append(attrs.get("href", ""))

    def handle_endtag(self, tag):
        self._skip -= tag in ("script", "style")

    def handle_data(self, data):
        if not self._skip:
            self.text.append(data)

    @property
    def words(self) -> str:
        return " ".join("".join(self.text).split())


def _plain(source: str) -> str:
    return " ".join(source.split())


def _shown_pngs(stem: str) -> list[str]:
    """The PNGs a learner's run of ``stem`` shows outside its exercises: the cells' own and
    those in the widgets' Output areas (as the notebook saved them)."""
    notebook = lesson(stem).notebook
    state, found = widget_state(notebook), []

    def walk(model_id: str) -> None:
        model = state.get(model_id.removeprefix("IPY_MODEL_"), {})
        values = model.get("state", {})
        for out in values.get("outputs", []) if model.get("model_name") == "OutputModel" else []:
            found.extend([out["data"]["image/png"]] if "image/png" in out.get("data", {}) else [])
        for child in values.get("children", []):
            walk(child)

    for cell in notebook.cells:
        if cell.cell_type != "code" or cell.metadata.get("nbgrader") \
                or "remove-cell" in cell.metadata.get("tags", []):
            continue
        for out in cell.outputs:
            data = out.get("data", {})
            if "image/png" in data:
                found.append(data["image/png"])
            if WIDGET_MIME in data:
                walk(data[WIDGET_MIME]["model_id"])
    return ["".join(png.split()) for png in found]


def _shown_text(stem: str) -> list[str]:
    """What the cells outside the exercises printed in this session's run (where lesson 02
    shows labkit's own ``average_gradients``, for instance)."""
    shown = []
    for cell in lesson(stem).notebook.cells:
        if cell.cell_type == "code" and not cell.metadata.get("nbgrader"):
            for out in cell.outputs:
                data = out.get("data", {})
                shown += [out.get("text", ""), data.get("text/plain", ""),
                          "".join(_Page(markup=data.get("text/html", "")).text)]
    return shown


@pytest.mark.parametrize("stem", STEMS)
def test_each_lesson_page_shows_its_plots(site, stem):
    page = site / "lessons" / f"{stem}.html"
    assert page.is_file(), f"no page for {stem}"
    shown = _Page(page)
    pngs = _shown_pngs(stem)
    assert pngs, f"{stem} showed no plot"
    embedded = {"".join(src.split(",", 1)[1].split()) for src in shown.images
                if src.startswith("data:image/png")}
    missing = [i for i, png in enumerate(pngs) if png not in embedded]
    assert not missing, f"{stem}: {len(missing)} of its {len(pngs)} plots are not on its page"
    assert colab_url(stem) in shown.links


@pytest.mark.parametrize("stem", STEMS)
def test_each_lesson_page_is_the_learners_copy(site, stem):
    words = _Page(site / "lessons" / f"{stem}.html").words
    source = nbformat.read(COURSE / f"{stem}.ipynb", as_version=4)
    learners = _plain(" ".join([c.source for c in release_notebook(source, stem).cells]
                               + _shown_text(stem)))
    answers = [c for c in source.cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answers, f"{stem} has no exercise"
    for cell in answers:
        solution = cell.source.split("### BEGIN SOLUTION")[1].split("### END SOLUTION")[0]
        for line in solution.splitlines():  # a line the learner's run shows nowhere
            if len(line.strip()) >= 12 and _plain(line) not in learners:
                assert _plain(line) not in words, f"{stem}'s page shows its solution: {line}"
        grade_id = cell.metadata["nbgrader"]["grade_id"].removesuffix("_answer")
        assert f"{grade_id}: PASSED" not in words
    assert "# YOUR CODE HERE raise NotImplementedError()" in words
    assert _plain(CHECK_NOTE) in words
    assert "labkit.record_results(" not in words  # the collapsed results cell is left out


@pytest.mark.parametrize("stem", STEMS)
def test_each_page_has_the_cells_of_the_learners_notebook(stem):
    """The page's cells are those of ``notebooks/<stem>.ipynb`` (``python -m labkit release``),
    the collapsed results cell left out, the badge under the title."""
    source = nbformat.read(COURSE / f"{stem}.ipynb", as_version=4)
    page = lesson_page(lesson(stem).notebook, source, stem)
    learners = nbformat.read(REPO / "notebooks" / f"{stem}.ipynb", as_version=4)
    kept = [c for c in learners.cells if "remove-cell" not in c.metadata.get("tags", [])]
    assert [c.source for c in page.cells[1:]] == [c.source for c in kept[1:]]
    title = kept[0].source.split("\n")[0]
    assert page.cells[0].source.startswith(f"{title}\n\n[![Open In Colab]")


def test_the_figures_are_on_the_pages_that_show_them(site):
    for figure in (REPO / "figures").glob("*.png"):
        assert (site / "figures" / figure.name).read_bytes() == figure.read_bytes()
    shown = []
    for page in site.rglob("*.html"):
        for src in _Page(page).images:
            if not src.startswith(("data:", "http:", "https:")):
                target = (page.parent / src.split("#")[0]).resolve()
                assert target.is_file(), f"{page.relative_to(site)} shows a missing {src}"
                shown.append((page.relative_to(site).as_posix(), src))
    assert any(src.startswith("figures/") for page, src in shown if page == "index.html")


def test_the_api_reference_is_made_of_docstrings(site):
    module = ast.parse((REPO / "labkit" / "training" / "api.py").read_text())
    train = next(node for node in module.body if getattr(node, "name", "") == "train")
    first = ast.get_docstring(train).split("\n")[0].replace("``", "")
    words = _Page(site / "api" / "training.html").words
    assert first in words
    assert "TrainConfig" in words and "Layout" in words


def test_the_changelog_is_the_repositorys(site):
    """Every release heading of CHANGELOG.md is on the page (``[0.2.0]`` is a link there)."""
    headings = [re.sub(r"\[([^\]]+)\]", r"\1", line[3:])
                for line in (REPO / "CHANGELOG.md").read_text().splitlines()
                if line.startswith("## ")]
    words = _Page(site / "changelog.html").words
    assert len(headings) >= 2 and all(_plain(h) in words for h in headings), headings


def test_a_broken_link_fails_the_build(tmp_path):
    """The project's mkdocs.yml (strict, its link validation; no plugins, which take seconds
    to load) over one page with a dead link."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# Home\n\nSee [the guide](no_such_page.md).\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(f"INHERIT: {REPO / 'mkdocs.yml'}\ndocs_dir: docs\nplugins: []\n"
                      "nav:\n  - index.md\n")
    with pytest.raises(SiteError, match="no_such_page.md"):
        mkdocs_build(config, tmp_path / "site")


def test_bad_folders_and_missing_tools_are_refused_before_anything_slow(tmp_path, capsys,
                                                                       monkeypatch):
    def never(*args, **kwargs):
        raise AssertionError("executed or built although the folders were wrong")

    monkeypatch.setattr(site_module, "execute_lessons", never)
    monkeypatch.setattr(site_module, "mkdocs_build", never)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "notes.txt").write_text("mine")
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / f"{STEMS[0]}.ipynb").write_text("{}")
    cases = {(str(busy),): "is not empty",
             (str(tmp_path / "out"), "--executed", str(tmp_path / "nowhere")): "not a folder",
             (str(tmp_path / "out"), "--executed", str(partial)): f"has no {STEMS[1]}.ipynb"}
    for (out, *more), said in cases.items():
        assert main(["docs", "--out", out, *more]) == 1
        assert said in capsys.readouterr().err
    assert (busy / "notes.txt").read_text() == "mine"
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name: None if name.startswith("mkdocs_jupyter") else real(name))
    assert main(["docs", "--out", str(tmp_path / "out")]) == 1
    assert "the site's build needs mkdocs-jupyter" in capsys.readouterr().err


def test_a_failed_build_leaves_the_site_in_out_as_it_was(tmp_path, monkeypatch):
    """mkdocs writes its pages before --strict fails on a warning: those pages never reach
    --out, and a passing build replaces the site there whole."""
    executed = tmp_path / "executed"
    executed.mkdir()
    for stem in STEMS:
        (executed / f"{stem}.ipynb").write_text("{}")
    monkeypatch.setattr(site_module, "stage", lambda staging, pages, repo: staging / "m.yml")

    def mkdocs(config, out, fail):
        out.mkdir(parents=True)
        (out / "index.html").write_text("new")
        if fail:
            raise SiteError("mkdocs build --strict failed:\nWARNING - a dead link")

    out = tmp_path / "site"
    out.mkdir()
    (out / site_module.MARKER).write_text("built")
    (out / "index.html").write_text("old")
    (out / "gone.html").write_text("old")
    monkeypatch.setattr(site_module, "mkdocs_build", lambda c, o: mkdocs(c, o, True))
    assert main(["docs", "--out", str(out), "--executed", str(executed)]) == 1
    assert (out / "index.html").read_text() == "old" and (out / "gone.html").exists()
    monkeypatch.setattr(site_module, "mkdocs_build", lambda c, o: mkdocs(c, o, False))
    assert main(["docs", "--out", str(out), "--executed", str(executed)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [site_module.MARKER, "index.html"]
    assert (out / "index.html").read_text() == "new"


def test_a_lesson_executed_from_another_version_is_refused():
    stem = STEMS[0]
    executed = nbformat.from_dict(dict(lesson(stem).notebook))
    executed.cells = [nbformat.from_dict(dict(c)) for c in executed.cells]
    executed.cells[-1].source += "\n# edited"
    source = nbformat.read(COURSE / f"{stem}.ipynb", as_version=4)
    with pytest.raises(PageError, match=re.escape(f"another version of course/{stem}")):
        lesson_page(executed, source, stem)


def test_a_lesson_that_stopped_on_an_error_is_refused():
    """Execution counts alone do not make a run: an error output (as ``nbconvert --execute
    --allow-errors`` leaves) or papermill's failure mark is refused."""
    stem = STEMS[0]
    source = nbformat.read(COURSE / f"{stem}.ipynb", as_version=4)
    executed = nbformat.from_dict(dict(source))
    executed.cells = [nbformat.from_dict(dict(c)) for c in source.cells]
    code = [c for c in executed.cells if c.cell_type == "code"]
    for count, cell in enumerate(code, 1):
        cell.execution_count = count
    code[2].outputs = [nbformat.v4.new_output("error", ename="RuntimeError", evalue="boom",
                                              traceback=[])]
    with pytest.raises(PageError, match=f"{stem}.ipynb failed in cell"):
        lesson_page(executed, source, stem)
    code[2].outputs = []
    code[3].metadata["papermill"] = {"exception": True}
    with pytest.raises(PageError, match=f"{stem}.ipynb failed in cell"):
        lesson_page(executed, source, stem)


def test_the_lessons_are_executed_one_by_one_with_progress(tmp_path):
    """``python -m labkit docs`` without ``--executed``: each course notebook under papermill,
    as it is (no parameters), a line per lesson; a failing one stops the build, named."""
    (tmp_path / "course").mkdir()
    for stem, code in {"a_lesson": "print(6 * 7)", "b_lesson": "raise ValueError('boom')"}.items():
        notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(code)])
        notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                           "language": "python"}
        nbformat.write(notebook, tmp_path / "course" / f"{stem}.ipynb")
    said = []
    done = site_module.execute_lessons(["a_lesson"], tmp_path, said.append, repo=tmp_path)
    assert "42" in done["a_lesson"].read_text()
    assert said[1] == "[ 1/1] a_lesson ..." and re.fullmatch(r"\[ 1/1\] a_lesson: \d+ s", said[2])
    with pytest.raises(SiteError, match="b_lesson failed in cell 0: ValueError: boom"):
        site_module.execute_lessons(["b_lesson"], tmp_path, said.append, repo=tmp_path)


def test_a_widget_becomes_a_still_picture_of_its_saved_state():
    """A slider panel (controls, an Output holding the plot) and a quiz's unanswered choice."""
    from labkit.classroom.widget_snapshots import snapshot

    png = {"output_type": "display_data", "data": {"image/png": "iVBORw0K"}, "metadata": {}}
    state = {
        "panel": {"model_name": "VBoxModel",
                  "state": {"children": ["IPY_MODEL_row", "IPY_MODEL_plot", "IPY_MODEL_q"]}},
        "row": {"model_name": "HBoxModel", "state": {"children": ["IPY_MODEL_size"]}},
        "size": {"model_name": "SelectionSliderModel",
                 "state": {"description": "model size", "_options_labels": ["1M", "2M"],
                           "index": 1}},
        "plot": {"model_name": "OutputModel", "state": {"outputs": [png]}},
        "q": {"model_name": "RadioButtonsModel",
              "state": {"_options_labels": ["yes", "no"], "index": None}}}
    shown = snapshot({"data": {WIDGET_MIME: {"model_id": "panel"}}}, state)
    assert [list(o["data"]) for o in shown] == [["text/html", "text/plain"], ["image/png"],
                                               ["text/html", "text/plain"]]
    assert "model size <b>2M</b>" in shown[0]["data"]["text/html"]
    assert shown[1]["data"]["image/png"] == "iVBORw0K"
    assert "<li>yes</li><li>no</li>" in shown[2]["data"]["text/html"]
