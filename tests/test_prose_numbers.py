"""A figure in a lab's prose is one the lab prints, one its code sets, or one said to come from elsewhere.

Numbers a reader could take for a measurement (with a decimal point, or of four digits or more) are looked
up in the same notebook's outputs and code, and in `course_lib` (where the labs' settings have their defaults).
What is left must be a version, a port, an issue's figure or a date (recognised by the words before it) or be
listed in ``ELSEWHERE`` with where it comes from. A figure typed into the prose from one run, which another
machine would not print, fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))

NUMBER = re.compile(r"(?<![\w.#/-])(\d+\.\d+|\d{1,3}(?:,\d{3})+|\d{4,})(?![\w.]*\d)")
# words right before a figure that say it is not a measurement of the lab's
NAMED = re.compile(r"(?:torch|torchrec|TorchRec|fbgemm|Python|Slurm|CUDA|version|release|port|issue|#\d+'s|Ubuntu)"
                   r"(?:'s)?[\w\s,-]{0,12}$")
ELSEWHERE = {  # (notebook, figure): where it comes from
    ("00_setup", "1024"): "the definition of a KiB",
    ("02_embeddings", "2114"): "the figures reported in torchrec issue #1756",
    ("05_sparse_optimizers", "500,000"): "half of the 1,000,000-row table the lab builds, on each of 2 ranks",
    ("01_collectives", "1.5"): "the ring formula 2(p - 1)/p at p = 4, beside the measured ratios",
    ("04_dmp", "1.0"): "what an NE or a calibration of one means, by definition",
    ("10_new_ids", "0.0"): "fbgemm's default initial accumulator, cited in the same sentence",
}


def _prose(markdown: str) -> str:
    markdown = re.sub(r"```.*?```", "", markdown, flags=re.DOTALL)  # code blocks
    markdown = re.sub(r"`[^`]*`", "", markdown)  # inline code
    markdown = re.sub(r"\]\([^)]*\)", "]", markdown)  # link targets
    return re.sub(r"https?://\S+", "", markdown)


def _text_of(cell: nbformat.NotebookNode) -> str:
    parts = [cell.source]
    for output in cell.get("outputs", []):
        parts.append(output.get("text", "") or "")
        for kind in ("text/plain", "text/html", "text/markdown"):
            value = output.get("data", {}).get(kind, "")
            parts.append("".join(value) if isinstance(value, list) else value)
        parts.extend(output.get("traceback", []))
    return "\n".join(parts)


def _plain(text: str) -> str:
    return text.replace(",", "").replace("_", "")


def _contains(text: str, figure: str) -> bool:
    """Whether `figure` appears in `text` as a whole number (1.5 is not in 11.52; 1000 is not in 10000)."""
    return re.search(rf"(?<![\d.]){re.escape(_plain(figure))}(?![\d]|\.\d)", text) is not None


LIBRARY = _plain("\n".join(p.read_text() for p in (REPO / "course_lib").rglob("*.py")))


def unsupported(nb: nbformat.NotebookNode, name: str) -> list[tuple[str, str]]:
    """(cell id, figure) for every figure in the prose that nothing shows, sets or names."""
    shown = _plain("\n".join(_text_of(cell) for cell in nb.cells if cell.cell_type == "code"))
    found = []
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        prose = _prose(cell.source)
        for match in NUMBER.finditer(prose):
            figure = match.group(1)
            if re.fullmatch(r"(19[5-9]\d|20[0-4]\d)", figure) or (name, figure) in ELSEWHERE:
                continue
            if NAMED.search(prose[max(0, match.start() - 40):match.start()]):
                continue
            if _contains(shown, figure) or ("." not in figure and _contains(LIBRARY, figure)):
                continue  # shown or set by the lab, or a default of the library (whole numbers only)
            found.append((cell.id, figure))
    return found


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_figure_in_the_prose_is_shown_set_or_sourced(path):
    assert unsupported(nbformat.read(path, as_version=4), path.stem) == []


def _notebook(markdown: str, output: str = "", code: str = "x = 1") -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(code)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=output)]
    return nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(markdown), cell])


@pytest.mark.parametrize("markdown, output, code, bad", [
    ("The copy runs at 5.97 GB/s here.", "copy: 5.17 GB/s", "x = 1", ["5.97"]),  # a figure from another run
    ("The copy runs at 5.17 GB/s here.", "copy: 5.17 GB/s", "x = 1", []),
    ("The table has 1,000,000 rows.", "", "rows = 1_000_000", []),  # set by the code
    ("torchrec 1.8 and torch 2.13, port 29500, since Slurm 22.05; in 2026.", "", "x = 1", []),
    ("Holds 12.5 MiB (`12.5`, in code) and 3,141 rows.", "", "x = 1", ["12.5", "3,141"]),
    ("A step takes 1.5 ms.", "steps: 11.52 ms", "x = 1", ["1.5"]),  # a whole number, not a piece of one
])
def test_unsupported_figures_are_found(markdown, output, code, bad):
    found = [figure for _, figure in unsupported(_notebook(markdown, output, code), "a_lab")]
    assert found == list(bad)
