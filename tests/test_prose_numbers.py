"""The prose-numbers checker itself (tests/prose_numbers.py): it finds a quoted number no cell
printed, accepts one a cell printed (at the precision the prose writes it), skips formulas and
references, and its allow-list names only phrases that are really in the notebooks.
The checker runs on every executed notebook in tests/test_notebooks.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.prose_numbers import ALLOWED, unprinted_numbers

REPO = Path(__file__).resolve().parent.parent


def _notebook(markdown: str, printed: str = "", parameters: str = "") -> dict:
    cells = [{"cell_type": "code", "metadata": {"tags": ["parameters"]}, "source": parameters,
              "outputs": []},
             {"cell_type": "code", "metadata": {}, "source": "run()",
              "outputs": [{"output_type": "stream", "name": "stdout", "text": printed}]},
             {"cell_type": "markdown", "metadata": {}, "source": markdown}]
    return {"cells": cells}


def test_a_number_no_cell_printed_is_found():
    found = unprinted_numbers(_notebook("Each step took 1.8 times less.", printed="1.42"), "x")
    assert len(found) == 1 and "'1.8'" in found[0] and "markdown cell 2" in found[0]


@pytest.mark.parametrize("said, printed", [
    ("The model has 4.27M parameters.", "4,273,160 parameters"),
    ("The model has 4.27M parameters.", "params: 4273160"),
    ("One more pass: 1.5 times DDP's traffic.", "zero1 1.50, fsdp 1.49"),
    ("About 16 bytes per parameter.", "16.2 bytes"),
    ("Half of it, 50%, waits.", "share 0.5"),
])
def test_a_printed_number_is_accepted_at_the_precision_written(said, printed):
    assert unprinted_numbers(_notebook(said, printed=printed), "x") == []


@pytest.mark.parametrize("said, hidden", [
    ("It runs (1.8x faster) on GPUs.", "1.8x"),         # was skipped whole after "("
    ("It costs (16 bytes per parameter).", "16"),       # was read as "6"
    ("With accumulation x4 it fits.", "4"),             # a factor written first
    ("The boundary is flat from 2-4 ranks.", "4"),      # a range's far end
])
def test_a_number_in_brackets_after_an_x_or_ending_a_range_is_still_a_claim(said, hidden):
    found = unprinted_numbers(_notebook(said), "x")
    assert any(f"{hidden!r}" in line for line in found), found


def test_only_a_cell_the_prose_can_point_at_backs_its_number():
    notebook = _notebook("Each parameter costs 16 bytes.")
    notebook["cells"].append({"cell_type": "code", "metadata": {}, "source": "later()",
                              "outputs": [{"output_type": "stream", "text": "batch 16"}]})
    assert unprinted_numbers(notebook, "x") == []  # the next cell prints it
    notebook["cells"].insert(3, {"cell_type": "markdown", "metadata": {}, "source": "More."})
    assert unprinted_numbers(notebook, "x")  # printed further down, for another reason


def test_a_fraction_backs_a_percentage_not_a_plain_number():
    assert unprinted_numbers(_notebook("It saves 20 percent.", printed="0.2013"), "x") == []
    assert unprinted_numbers(_notebook("It takes 20 steps.", printed="loss 0.2013"), "x")


def test_a_printed_number_at_another_precision_is_not_accepted():
    assert unprinted_numbers(_notebook("It takes 1.5 times as long.", printed="1.58"), "x")


def test_a_setting_of_the_parameters_cell_may_be_said_again():
    notebook = _notebook("Here 4 ranks run.", parameters="world_size = 4   # 7 is a comment")
    assert unprinted_numbers(notebook, "x") == []
    assert unprinted_numbers(_notebook("Here 7 ranks run.", parameters="w = 4  # 7"), "x")


def test_a_number_in_a_code_cell_that_is_not_printed_does_not_count():
    notebook = _notebook("It needs 16 bytes per parameter.")
    notebook["cells"][1]["source"] = "bytes_per_param = 16"
    assert unprinted_numbers(notebook, "x")


@pytest.mark.parametrize("text", [
    "Each rank sends 2(N-1)/N of the tensor, and 1/N of it per step.",
    "The bubble is (p-1)/(m+p-1); here m = 1.",
    "As notebook 02 showed, and notebooks 03 to 05 will.",
    "# 05 · Sharded data parallelism",
    "GPipe (Huang et al., 2019) splits the batch.",
    "Rank 0 sends micro-batch 1 to stage 2.",
    "Call `split(x, 64)` and read $2^{10}$.",
    "1. first\n2. second\n3. third",
    "In torch 2.13 it works; GPT-3 was trained on a 3D grid.",
])
def test_formulas_references_and_names_are_not_claims(text):
    assert unprinted_numbers(_notebook(text), "x") == []


def test_every_allowed_phrase_is_in_its_notebook_with_a_reason():
    sources = {path.stem: path.read_text() for path in (REPO / "course").glob("*.ipynb")}
    for where, phrase, why in ALLOWED:
        texts = sources.values() if where == "*" else [sources[where]]
        cells = [c for text in texts for c in json.loads(text)["cells"]]
        markdown = [" ".join("".join(c["source"]).split()) for c in cells
                    if c["cell_type"] == "markdown"]
        assert any(phrase in m for m in markdown), f"stale allow-list entry: {phrase!r}"
        assert len(why) > 10, f"say why {phrase!r} is not a measurement"
