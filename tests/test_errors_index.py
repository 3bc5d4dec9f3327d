"""ERRORS.md, the index by error message: complete, and every entry points at a cell that still shows it."""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
INDEX = REPO / "ERRORS.md"
ROW = re.compile(r"^\| `(?P<message>[^`|]+)` \| .*?\((?:labs|solutions)/(?P<notebook>\d\d_\w+)\.ipynb\), cell `(?P<cell>[^`]+)`")


def entries(text: str) -> list[dict[str, str]]:
    """The rows of the index: message fragment, notebook, cell id."""
    return [match.groupdict() for line in text.splitlines() if (match := ROW.match(line))]


def shown(cell) -> str:
    """What a cell's stored outputs show: error names and messages, printed text, plain-text results."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
        elif output.output_type == "stream":
            parts.append(output.text)
        else:
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def provoking_cells() -> list[tuple[str, str]]:
    """(notebook, cell id) of every solution cell that raises on purpose (nbval's raises-exception tag or marker)."""
    found = []
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and ("raises-exception" in cell.metadata.get("tags", [])
                                             or "NBVAL_RAISES_EXCEPTION" in cell.source):
                found.append((path.stem, cell.id))
    return found


def problems(index_text: str) -> list[str]:
    """What is wrong with an index: provoked errors it lacks, rows that point at nothing or at another message."""
    rows = entries(index_text)
    listed = {(row["notebook"], row["cell"]) for row in rows}
    found = [f"{notebook} cell {cell} raises on purpose but is not in ERRORS.md"
             for notebook, cell in provoking_cells() if (notebook, cell) not in listed]
    notebooks = {}
    for row in rows:
        path = REPO / "solutions" / f"{row['notebook']}.ipynb"
        if not path.exists():
            found.append(f"{row['message']!r}: no notebook {path.name}")
            continue
        cells = notebooks.setdefault(path, {c.id: c for c in nbformat.read(path, as_version=4).cells})
        cell = cells.get(row["cell"])
        if cell is None:
            found.append(f"{row['message']!r}: {path.name} has no cell {row['cell']}")
        elif row["message"] not in shown(cell):
            found.append(f"{row['message']!r}: {path.name} cell {row['cell']} no longer shows it")
    return found


def test_the_index_lists_every_provoked_error_and_each_entry_still_holds():
    text = INDEX.read_text(encoding="utf-8")
    assert len(entries(text)) >= len(provoking_cells())
    assert problems(text) == []


def test_the_index_is_linked_from_the_readme_and_lab_00():
    assert "ERRORS.md" in (REPO / "README.md").read_text(encoding="utf-8")
    lab00 = nbformat.read(REPO / "labs" / "00_setup.ipynb", as_version=4)
    assert any("ERRORS.md" in cell.source for cell in lab00.cells if cell.cell_type == "markdown")


def test_a_missing_error_and_a_stale_entry_are_found():
    text = INDEX.read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if ROW.match(line)]
    assert rows
    notebook, cell = provoking_cells()[0]  # drop every row of one provoking cell
    dropped = "\n".join(line for line in text.splitlines()
                        if not ((m := ROW.match(line)) and (m["notebook"], m["cell"]) == (notebook, cell)))
    assert any(f"{notebook} cell {cell} raises on purpose but is not in ERRORS.md" in p for p in problems(dropped))
    first = ROW.match(rows[0])
    moved = text.replace(f"cell `{first['cell']}`", "cell `no-such-cell`", 1)
    assert any("has no cell no-such-cell" in p for p in problems(moved))
    reworded = text.replace(f"`{first['message']}`", "`a message no cell shows`", 1)
    assert any("no longer shows it" in p for p in problems(reworded))


@pytest.mark.parametrize("line, expected", [
    ("| `No available sharding type` | [03_sharding §3 Row-wise](labs/03_sharding.ipynb), cell `c26` | why |",
     {"message": "No available sharding type", "notebook": "03_sharding", "cell": "c26"}),
    ("| message | where | cause and fix |", None),
])
def test_rows_are_read(line, expected):
    assert (entries(line) or [None])[0] == expected
