"""Numbers in a notebook's prose must be printed by its cells (or set by them).

A lesson that says "16 bytes per parameter" or "1.5 times DDP's traffic" must show that number
where the learner can see it came from a run: in the text output of a code cell of the
*executed* notebook (stream, text/plain, or an HTML table), or as a setting in the cell
tagged ``parameters`` (or the one papermill injected). ``unprinted_numbers(executed)`` lists
every number in the markdown that no cell printed or set; ``tests/test_notebooks.py``
requires the list empty for every notebook it executes, at smoke size. So a measured number
cannot be quoted in prose: at smoke size the run prints other values, and the quote fails the
test. Prose refers to what the cell above printed instead.

Only cells the prose can point at count: those above the markdown cell, and the code cells
that follow it up to the next markdown cell ("the next cell prints..."); a value printed
further down, for another reason, does not back a claim made here. A percentage ("20%") may
be printed as a fraction (0.2); a plain number may not.

Not claims, and skipped: inline code and math, formulas in N/p/m (``2(N-1)/N``), references to
notebooks ("notebook 02", "notebooks 03 to 05", the title's "05 ·"), citation years ("Huang et
al., 2019"), link targets, and the reviewed ``ALLOWED`` phrases below (each with its reason).
"""

from __future__ import annotations

import html
import re

# A reviewed list of phrases whose numbers are facts of the world or definitions, not
# measurements of this notebook: (notebook stem or "*", phrase, why). Keep it short.
ALLOWED: tuple[tuple[str, str, str], ...] = (
    ("*", "0.5 is guessing", "the AUC of a random ranking, by definition"),
    ("01_the_memory_wall", "4 bytes a number", "the size of a float32, by definition"),
    ("01_the_memory_wall", "within 2%, the optimizer and the activations within 5%",
     "the exercise check's own tolerances (labkit/lessons/memory_wall/check.py)"),
    ("05_sharded_data_parallel", "2 bytes of weight, 2 of gradient and 12 of optimizer",
     "the ZeRO paper's count, quoted as the paper's (the plot below projects it)"),
    ("05_sharded_data_parallel", "7.5B-parameter model on 64", "the ZeRO paper's example"),
    ("07_putting_it_together", "a 3D grid of 8 ranks",
     "the size of the layout in the code just before it, pp=2 x dp=2 x tp=2"),
)

_MULTIPLIERS = {"x": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "million": 1e6,
                "billion": 1e9, "thousand": 1e3}
_NUMBER = re.compile(
    r"(?<![\w.\-])(\d{1,3}(?:,\d{3})+|\d+(?:\.\d+)?(?:e[+-]?\d+)?)"
    r"(?:\s?(k|K|M|B|G|x|million|billion|thousand)\b)?(?![\w])")
_SKIP = [
    re.compile(r"```.*?```", re.S),                         # fenced code
    re.compile(r"`[^`]*`"),                                 # inline code
    re.compile(r"\$[^$]*\$"),                               # math
    re.compile(r"\]\([^)]*\)"),                             # link targets
    re.compile(r"<[^>]+>"),                                 # html tags
    re.compile(r"et al\.,? \d{4}"),                         # citation years
    re.compile(r"\b[A-Z][a-z]+,? (?:19|20)\d{2}\b"),          # "(Young 1974, Daly 2006)"
    re.compile(r"^\s*\d+\.\s", re.M),                        # a numbered list's markers
    re.compile(r"\b(?:torch|PyTorch|Python) \d+(?:\.\d+)+"),    # versions
    re.compile(r"\bnotebooks? \d\d(?:(?:\s*(?:,|and|to|-|or)\s*)\d\d)*", re.I),
    re.compile(r"^#+ \d\d ·", re.M),                        # the title's number
    re.compile(r"\*\*\d\d ·"),                              # "**01 · The memory wall**"
    # an index names a thing, it does not count: rank 0, micro-batch 1, stage 2
    re.compile(r"\b(?:rank|device|stage|micro-batch|table|layer|step)s? \d+\b", re.I),
    # formulas in the rank count N, stages p, micro-batches m: 2(N-1)/N, (p-1)/(m+p-1), 1/N
    re.compile(r"[\d()+\-*/x ]*\b[Npm]\b(?:\s*[-+*/=x]\s*[\d()Npm+\-*/ ]+)+"),
    re.compile(r"\d+\s*/\s*[Npm]\b|\b[Npm]\s*[-+*/x]\s*\d+"),
]
# Numbers glued to a sign that would hide them from _NUMBER: "x4" (a factor written first),
# "2-4" and "2–4" (a range: both ends are claims). Applied after the skips above, so that
# formulas and names ("GPT-3") are gone by then.
_UNGLUE = [(re.compile(r"(?<![\w.])[x×](?=\d)"), " "),
           (re.compile(r"(?<=\d)[-–](?=\d)"), " to ")]


def _strip(text: str, stem: str) -> str:
    for pattern in _SKIP:
        text = pattern.sub(" ", text)
    for pattern, replacement in _UNGLUE:
        text = pattern.sub(replacement, text)
    for where, phrase, _why in ALLOWED:
        if where in ("*", stem):
            text = re.sub(r"\s+".join(map(re.escape, phrase.split())), " ", text)
    return text


def _numbers(text: str) -> list[tuple[re.Match, float, int, float]]:
    """(match, mantissa, decimals, multiplier) of every number in ``text``."""
    found = []
    for match in _NUMBER.finditer(text):
        digits, suffix = match.group(1), match.group(2)
        value = float(digits.replace(",", ""))
        decimals = len(digits.split(".")[1]) if "." in digits and "e" not in digits else 0
        found.append((match, value, decimals, _MULTIPLIERS.get(suffix or "", 1.0)))
    return found


def _printed_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if "text" in output:
            parts.append("".join(output["text"]))
        data = output.get("data", {})
        for mime in ("text/plain", "text/html", "text/markdown"):
            if mime in data:
                body = "".join(data[mime])
                parts.append(html.unescape(re.sub(r"<[^>]+>", " ", body)))
    return "\n".join(parts)


def _code_text(cell: dict) -> str:
    """The settings' source without its comments (a comment is prose too)."""
    source = "".join(cell["source"])
    return "\n".join(line.split("#", 1)[0] for line in source.splitlines())


def _known_values(cells: list[dict]) -> set[float]:
    values: set[float] = set()
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        texts = [_printed_text(cell)]
        tags = cell.get("metadata", {}).get("tags", [])
        if "parameters" in tags or "injected-parameters" in tags:
            texts.append(_code_text(cell))  # a setting, said again in prose
        for text in texts:
            for _token, value, _decimals, multiplier in _numbers(text):
                values.update({value, value * multiplier})
    return values


def _matches(value: float, decimals: int, multiplier: float, known: set[float],
             percent: bool = False) -> bool:
    """Does some printed value round to the prose's number, at the precision it is written?"""
    tolerance = 0.5 * 10 ** -decimals + 1e-9
    for candidate in known:  # "4.27M" <- 4270336; "16" <- 16.0; "20%" <- 0.2
        for said in (candidate, candidate / multiplier) + ((candidate * 100,) if percent else ()):
            if abs(said - value) <= tolerance:
                return True
    return False


def _code_cells_after(cells: list[dict], index: int) -> list[dict]:
    """The code cells right after markdown cell ``index``, up to the next markdown cell."""
    after = []
    for cell in cells[index + 1:]:
        if cell["cell_type"] == "markdown":
            break
        after.append(cell)
    return after


def unprinted_numbers(notebook: dict, stem: str) -> list[str]:
    """Every number in the markdown of the executed ``notebook`` that no code cell printed."""
    cells, missing = notebook["cells"], []
    for index, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        known = _known_values(cells[:index] + _code_cells_after(cells, index))
        text = _strip("".join(cell["source"]), stem)
        for match, value, decimals, multiplier in _numbers(text):
            percent = re.match(r"\s?(?:%|per ?cent)", text[match.end():]) is not None
            if not _matches(value, decimals, multiplier, known, percent):
                around = " ".join(text[max(0, match.start() - 50): match.end() + 30].split())
                missing.append(f"markdown cell {index}: {match.group(0)!r} in '...{around}...'")
    return missing
