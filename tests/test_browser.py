"""The learner's view: every learners' notebook (``notebooks/``, exercises not done yet)
opened in a real JupyterLab, in headless Chromium, run from the Run menu to the end without an
error; the main slider of notebooks 01 to 06 is moved and the plot must redraw. Then the lecture
app served by Voila (docs/instructor.md), its slider moved the same way. First, the course's web
site (tests/built_site.py): its index, a lesson page with its plots, an API page. Screenshots
and the measured slider latency go to artifacts/browser/.

Needs Debian's ``chromium`` and the ``playwright`` package (driving the system browser; no
browser download). ``.ci/run`` installs both; elsewhere this test is skipped with that reason.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.built_site import SITE_TIMEOUT_S, built_site
from tests.lessons import SMOKE

REPO = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO / "artifacts" / "browser"
CHROMIUM = shutil.which("chromium")
try:
    from playwright.sync_api import sync_playwright
except ImportError:
    sync_playwright = None

pytestmark = pytest.mark.skipif(
    CHROMIUM is None or sync_playwright is None,
    reason="needs Debian's chromium (apt-get install chromium) and pip's playwright; "
           ".ci/run installs both")

# notebook -> (the description of the slider a learner moves first, the key that moves it:
# the model size starts smallest, the GPU count largest)
SLIDERS = {"01_the_memory_wall": ("model size", "ArrowRight"),
           "02_data_parallel": ("GPUs", "ArrowLeft"),
           "03_pipeline_parallel": ("micro-batches", "ArrowLeft"),
           "04_tensor_parallel": ("TP degree", "ArrowLeft"),
           "05_sharded_data_parallel": ("GPUs", "ArrowLeft"),
           "06_recommender_at_scale": ("table size", "ArrowRight"),
           "07_putting_it_together": ("tp", "ArrowLeft"),
           "08_long_sequences_and_experts": ("sequence length", "ArrowLeft"),
           "09_plan_a_real_run": ("nodes", "ArrowRight"),
           "10_when_a_gpu_dies": ("GPU MTBF", "ArrowLeft")}
RUN_ALL_TIMEOUT_S = 240


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prepare_root(root: Path) -> None:
    """Copy the notebooks with their smoke-size parameters injected, widgets on."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    shutil.copytree(REPO / "notebooks" / "quizzes", root / "quizzes")
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        parameters = {**SMOKE[path.stem], "interactive": True}
        nb = parameterize_notebook(load_notebook_node(str(path)), parameters)
        nbformat.write(nb, root / path.name)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    _prepare_root(root)
    settings = tmp_path_factory.mktemp("settings")
    notes = settings / "@jupyterlab" / "apputils-extension"
    notes.mkdir(parents=True)
    (notes / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    tracker = settings / "@jupyterlab" / "notebook-extension"
    tracker.mkdir(parents=True)  # render every cell, so that every prompt can be read
    (tracker / "tracker.jupyterlab-settings").write_text(json.dumps({"windowingMode": "none"}))
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp_path_factory.mktemp("log") / "lab.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1",
         f"--port={port}", f"--IdentityProvider.token={token}", "--allow-root",
         f"--ServerApp.root_dir={root}", "--LabApp.extension_manager=readonly",
         "--LabApp.news_url=None"],
        env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(settings)}, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail(f"JupyterLab did not start; see {log.name}")
            time.sleep(0.5)
    yield url, token
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("profile")), executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
            viewport={"width": 1280, "height": 1000})
        yield context
        context.close()


def _run_all(page) -> None:
    page.get_by_text("Python 3 (ipykernel) | Idle").wait_for(timeout=90_000)
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    deadline = time.monotonic() + RUN_ALL_TIMEOUT_S
    prompts = page.locator(".jp-CodeCell .jp-InputArea-prompt")
    while time.monotonic() < deadline:
        texts = prompts.all_inner_texts()
        if texts and all(t.strip().startswith("[") and t.strip()[1:-2].isdigit() for t in texts):
            return
        time.sleep(1)
    pytest.fail(f"Run All did not finish in {RUN_ALL_TIMEOUT_S} s: prompts {texts}")


def _saved_errors(page, url: str, token: str, name: str) -> list[str]:
    page.keyboard.press("Control+s")
    time.sleep(2)
    with urllib.request.urlopen(f"{url}/api/contents/{name}?token={token}&content=1") as r:
        cells = json.load(r)["content"]["cells"]
    return [f"{o['ename']}: {o['evalue']}" for c in cells if c["cell_type"] == "code"
            for o in c.get("outputs", []) if o.get("output_type") == "error"]


def _move_slider(page, label: str, key: str) -> float:
    """Press ``key`` on the slider; seconds until the plot image changed and settled."""
    slider = page.locator(".widget-hslider", has_text=label).first
    # the plot of the slider's own panel (labkit's slider_panel: a VBox of controls, plot...),
    # not the first plot of the page: a notebook may show several widgets
    panel = slider.locator("xpath=ancestor::div[contains(concat(' ', normalize-space(@class), "
                           "' '), ' widget-vbox ')][1]")
    image = panel.locator(".widget-output img").first
    before = image.get_attribute("src")
    slider.locator(".noUi-handle").focus()
    start = time.monotonic()
    page.keyboard.press(key)
    changed_at, last = None, before
    while time.monotonic() - start < 120:
        src = image.get_attribute("src")
        if src != last:
            changed_at, last = time.monotonic(), src
        elif changed_at and time.monotonic() - changed_at > 1.5:
            return changed_at - start
        time.sleep(0.05)
    pytest.fail(f"the plot did not redraw after moving '{label}'")


@pytest.fixture
def served_site():
    """The course's web site (tests/built_site.py) over HTTP on this machine."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
         "--directory", str(built_site())],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{url}/index.html", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("the site's HTTP server did not start")
            time.sleep(0.2)
    yield url
    server.terminate()
    server.wait(timeout=20)


# Defined first, so that it runs first: in a whole run its site comes from the lessons
# executed at classroom defaults once per session, and these are then executed before any
# JupyterLab kernel of the tests below is up (their timings stay undisturbed).
@pytest.mark.timeout(SITE_TIMEOUT_S)
def test_site_in_chromium(served_site, browser):
    """The built site: its index, a lesson page with every plot loaded, an API page. Requests
    to other hosts are refused (the site reads without them; Colab's badge is one)."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page, outside = browser.new_page(), []

    def local_only(route):
        if route.request.url.startswith(served_site):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", local_only)
    page.goto(f"{served_site}/index.html")
    assert page.locator(".md-nav__link", has_text="Lessons").count() > 0
    page.screenshot(path=str(ARTIFACTS / "site-index.png"))
    page.goto(f"{served_site}/lessons/01_the_memory_wall.html")
    page.wait_for_load_state("load")
    widths = page.evaluate("Array.from(document.images).filter(i => i.src.startsWith('data:'))"
                           ".map(i => i.naturalWidth)")
    assert len(widths) >= 3 and all(w > 0 for w in widths), widths
    assert page.locator("a[href*='colab.research.google.com']").count() == 1
    page.screenshot(path=str(ARTIFACTS / "site-lesson-01.png"))
    page.goto(f"{served_site}/api/training.html")
    heading = page.locator("[id='labkit.training.api.train']")
    assert heading.is_visible()
    assert "Train on every rank of cluster" in page.locator(".doc-contents").first.inner_text()
    page.screenshot(path=str(ARTIFACTS / "site-api-training.png"))
    print(f"site: requests refused to other hosts: {sorted(set(outside))}")
    page.close()


@pytest.mark.parametrize("name", sorted(SMOKE))
def test_notebook_in_jupyterlab(lab, browser, name):
    url, token = lab
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page()
    # A workspace of its own, reset: only this notebook is open and active.
    page.goto(f"{url}/lab/workspaces/{name}/tree/{name}.ipynb?reset&token={token}")
    _run_all(page)
    page.screenshot(path=str(ARTIFACTS / f"{name}-run-all.png"), full_page=True)
    assert _saved_errors(page, url, token, f"{name}.ipynb") == []
    if name in SLIDERS:
        seconds = _move_slider(page, *SLIDERS[name])
        page.screenshot(path=str(ARTIFACTS / f"{name}-after-slider.png"), full_page=True)
        latency = ARTIFACTS / "slider_latency.json"
        figures = json.loads(latency.read_text()) if latency.exists() else {}
        figures[name] = round(seconds, 2)
        latency.write_text(json.dumps(figures, indent=1))
        print(f"{name}: slider release -> redrawn plot in {seconds:.2f} s")
    page.close()


APP = REPO / "notebooks" / "apps" / "memory_wall_app.ipynb"
APP_SMOKE = {"sizes": [2e5, 5e5, 2e6], "size": 2e5}


@pytest.fixture
def voila_app(tmp_path):
    """``voila notebooks/apps/memory_wall_app.ipynb`` (docs/instructor.md), at smoke size."""
    import nbformat
    from papermill.iorw import load_notebook_node
    from papermill.parameterize import parameterize_notebook

    nbformat.write(parameterize_notebook(load_notebook_node(str(APP)), APP_SMOKE),
                   tmp_path / APP.name)
    port = _free_port()
    log = open(tmp_path / "voila.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "voila", str(tmp_path / APP.name), "--no-browser",
         f"--port={port}", "--Voila.ip=127.0.0.1"], stdout=log, stderr=log, cwd=tmp_path)
    deadline = time.monotonic() + 60
    while True:  # the TCP port (Voila's API answers 403 without a session)
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            pytest.fail(f"Voila did not start; see {log.name}")
        time.sleep(0.5)
    yield f"http://127.0.0.1:{port}/"
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


def test_voila_serves_the_lecture_app(voila_app, browser):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page()
    page.goto(voila_app)
    page.locator(".widget-output img").first.wait_for(timeout=RUN_ALL_TIMEOUT_S * 1000)
    assert page.locator(".jp-InputArea-editor").count() == 0  # an app: no code shown
    seconds = _move_slider(page, "model size", "ArrowRight")
    page.screenshot(path=str(ARTIFACTS / "voila-memory-wall-app.png"), full_page=True)
    print(f"voila app: slider release -> redrawn plot in {seconds:.2f} s")
    page.close()
