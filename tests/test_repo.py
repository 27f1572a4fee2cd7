"""The repository keeps its promises: README commands, CI, lint, CLI, figures."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


CLONE = "git clone https://github.com/labkit-course/labkit && cd labkit"


def _readme_blocks() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (REPO / "README.md").read_text(), re.S)


def _readme_commands() -> list[str]:
    """The README's bash blocks after the one that clones the repository."""
    return [block for block in _readme_blocks() if not block.startswith("git clone ")]


def test_ci_runs_the_readme_test_command():
    open_cmd, test_cmd = _readme_commands()[:2]
    assert "jupyter lab notebooks/" in open_cmd
    assert "pytest" in test_cmd
    assert test_cmd in (REPO / ".ci" / "run").read_text()


def test_the_readme_is_a_front_door():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 150
    assert _readme_blocks()[0] == CLONE  # the first command a newcomer types


def test_every_relative_link_of_the_readme_points_at_a_file():
    text = (REPO / "README.md").read_text()
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    relative = [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t)]
    assert relative, "the README links no file of the repository"
    missing = [t for t in relative if t and not (REPO / t).exists()]
    assert not missing, missing


def test_notebooks_are_committed_without_outputs_and_with_parameters():
    for path in sorted([*(REPO / "course").glob("*.ipynb"), *(REPO / "notebooks").glob("*.ipynb"),
                        *(REPO / "notebooks" / "apps").glob("*.ipynb")]):
        cells = json.loads(path.read_text())["cells"]
        code = [c for c in cells if c["cell_type"] == "code"]
        assert not any(c.get("outputs") or c.get("execution_count") for c in code), path.name
        tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
        assert len(tagged) == 1, f"{path.name} needs exactly one cell tagged 'parameters'"


@pytest.mark.skipif(shutil.which("ruff", path=str(Path(sys.executable).parent)) is None,
                    reason="ruff is installed by requirements-dev.txt")
def test_ruff_is_clean():
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent))
    result = subprocess.run([ruff, "check", "."], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_doctor_reports_a_ready_machine():
    result = subprocess.run([sys.executable, "-m", "labkit", "doctor"], cwd=REPO,
                            capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "torch 2.13.0" in result.stdout
    assert "ok   2-rank all_reduce on cpu" in result.stdout


def test_figures_script_runs_at_smoke_size(tmp_path):
    result = subprocess.run([sys.executable, "figures/make.py", "--smoke", "--out",
                             str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    for name in ("all_reduce", "memory_wall", "boundary", "sharding", "speedup", "composed"):
        png = tmp_path / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert str(png) in result.stdout
