"""The course's reference answers, so that a learner can skip an exercise and still run the rest of a lab.

An exercise's reference answer is its cell in the solution notebook (``solutions/NN_name.ipynb``, the single
source of the course's content): the code cell with a ``### BEGIN SOLUTION`` region that comes last before the
cell calling the exercise's check (``labNN.check_...(``). When a check does not pass, it runs that cell's code
in the notebook's namespace, so the names the exercise defines (``save``, ``AppState``, ...) become the
reference's for the cells below. Nothing is printed of the reference's code or output. The learner's own
answer comes back as soon as they run their cell again.

``COURSE_SOLUTIONS`` names another folder of solution notebooks; without one, the ``solutions/`` folder beside
the course's ``course_lib`` is used.
"""
from __future__ import annotations

import ast
import contextlib
import functools
import io
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_BEGIN = "### BEGIN SOLUTION"


def solutions_dir() -> Path:
    return Path(os.environ.get("COURSE_SOLUTIONS") or Path(__file__).resolve().parents[1] / "solutions")


@dataclass(frozen=True)
class ReferenceCell:
    notebook: Path
    cell_id: str
    source: str

    @property
    def names(self) -> list[str]:
        """The names the cell defines at its top level, in order (functions, classes, assignments, imports)."""
        names: list[str] = []
        for node in ast.parse(self.source).body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.append(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names += [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
        return list(dict.fromkeys(names))

    @property
    def answers(self) -> list[str]:
        """What a learner writes: the functions and classes the cell defines (its other names are givens)."""
        nodes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
        return [node.name for node in ast.parse(self.source).body if isinstance(node, nodes)] or self.names


class NoReference(LookupError):
    """The exercise has no reference answer here (no solutions/ folder, or no cell for that check)."""


def _cells(notebook: Path) -> list[dict]:
    nb = json.loads(notebook.read_text(encoding="utf-8"))
    for cell in nb["cells"]:
        if isinstance(cell["source"], list):
            cell["source"] = "".join(cell["source"])
    return nb["cells"]


@functools.lru_cache(maxsize=None)
def _find(folder: str, lab: str, check: str, stamp: float) -> ReferenceCell:
    notebooks = sorted(Path(folder).glob(f"{lab}_*.ipynb"))
    if not notebooks:
        raise NoReference(f"no solution notebook {lab}_*.ipynb in {folder}")
    notebook = notebooks[0]
    cells = _cells(notebook)
    call = re.compile(rf"\blab{lab}\.{re.escape(check)}\(")
    for index, cell in enumerate(cells):
        if cell["cell_type"] == "code" and call.search(cell["source"]):
            for earlier in reversed(cells[:index]):
                if earlier["cell_type"] == "code" and _BEGIN in earlier["source"]:
                    return ReferenceCell(notebook, earlier.get("id", ""), earlier["source"])
            break
    raise NoReference(f"{notebook.name} has no exercise cell before its call of lab{lab}.{check}")


def reference_cell(lab: str, check: str) -> ReferenceCell:
    """The solution cell that answers `check` of `lab` ("08", "check_save"); raises :class:`NoReference`."""
    folder = solutions_dir()
    notebooks = sorted(folder.glob(f"{lab}_*.ipynb")) if folder.is_dir() else []
    stamp = notebooks[0].stat().st_mtime if notebooks else 0.0
    return _find(str(folder), lab, check, stamp)


def use_reference(lab: str, check: str, namespace: dict[str, Any]) -> ReferenceCell:
    """Run the reference answer of `check` in `namespace` (a notebook's globals) and return its cell.

    Its output is swallowed: a learner sees that the reference is in use, not what it is. Raises
    :class:`NoReference` when there is none here; an error inside the reference propagates.
    """
    cell = reference_cell(lab, check)
    code = compile(cell.source, f"<reference answer: {cell.notebook.name} {cell.cell_id}>", "exec")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        exec(code, namespace)  # noqa: S102 - the course's own solution cell, run where the learner's ran
    return cell
