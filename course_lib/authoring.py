"""Student labs from solution notebooks: `solutions/NN_name.ipynb` is the source, `labs/NN_name.ipynb` is generated.

A solution notebook is complete and executed. Its student copy is made with nbgrader's own preprocessors, used
without nbgrader's database or per-cell metadata:

- code between `### BEGIN SOLUTION` and `### END SOLUTION` becomes `# YOUR CODE HERE` / `raise
  NotImplementedError()` (indented like the BEGIN line); the lines around the region stay. In a markdown cell
  the region becomes `YOUR ANSWER HERE`;
- `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS` blocks are dropped;
- outputs and execution counts are cleared;

then metadata is normalised so the lab is byte-identical on every run, whoever executed the solution: cell
ids are kept, cell metadata is reduced to `tags`, `editable` and `deletable`, and notebook metadata to a fixed
Python 3 kernelspec.

    python -m course_lib.authoring build   # write labs/ (what `make labs` runs)
    python -m course_lib.authoring check   # exit 1 when labs/ is not what `build` would write
"""
from __future__ import annotations

import argparse
import copy
import hashlib
import sys
from collections.abc import Sequence
from pathlib import Path

import nbformat
from nbformat import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests, ClearOutput, ClearSolutions

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = {"name": "python"}
KEPT_CELL_METADATA = ("tags", "editable", "deletable")

SOLUTION_DELIMITERS = (ClearSolutions.begin_solution_delimeter.default_value,
                       ClearSolutions.end_solution_delimeter.default_value)
HIDDEN_TESTS_DELIMITERS = (ClearHiddenTests.begin_test_delimeter.default_value,
                           ClearHiddenTests.end_test_delimeter.default_value)


def make_lab(solution: NotebookNode, name: str = "notebook") -> NotebookNode:
    """The student copy of `solution` (left unchanged); `name` labels errors and derived cell ids.

    Raises ValueError, naming the notebook and the cell, when a BEGIN/END SOLUTION or HIDDEN TESTS marker has
    no partner, or when the notebook is not a Python notebook.
    """
    nb = copy.deepcopy(solution)
    for cell in nb.cells:
        if isinstance(cell.get("source"), list):  # a hand-built node; nbformat.read joins these
            cell.source = "".join(cell.source)
    _language(nb, name)
    _check_regions(nb, name)

    nb.metadata = NotebookNode({"kernelspec": dict(KERNELSPEC)})  # the key ClearSolutions reads the language from
    resources: dict = {}
    for preprocessor in (
        ClearSolutions(enforce_metadata=False),
        ClearHiddenTests(enforce_metadata=False),
        ClearOutput(),
    ):
        try:
            nb, resources = preprocessor.preprocess(nb, resources)
        except RuntimeError as error:  # _check_regions should have caught these first
            raise ValueError(f"{name}: {type(preprocessor).__name__} failed: {error}") from error
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.source = _drop_nbval_markers(cell.source)
    return _normalise(nb, name)


_NBVAL_MARKERS = {"NBVAL_IGNORE_OUTPUT", "NBVAL_CHECK_OUTPUT", "NBVAL_RAISES_EXCEPTION", "NBVAL_SKIP"}


def _drop_nbval_markers(source: str) -> str:
    """Remove nbval's marker comments: they steer CI's run of the solutions and mean nothing to a learner."""
    lines = source.split("\n")
    kept = [line for line in lines if not (line.strip().startswith("#") and line.strip().lstrip("#").strip() in _NBVAL_MARKERS)]
    return "\n".join(kept)


def render_lab(solution_path: str | Path) -> str:
    """The exact text of the lab for the solution notebook at `solution_path` (what `nbformat.write` writes)."""
    path = Path(solution_path)
    solution = nbformat.read(path, as_version=4)
    lab = make_lab(solution, name=path.name)
    text = nbformat.writes(lab)
    return text if text.endswith("\n") else text + "\n"


def build_labs(solutions_dir: str | Path = "solutions", labs_dir: str | Path = "labs") -> list[Path]:
    """Write the lab of every solution notebook and delete labs whose solution is gone.

    Returns the lab paths that changed on disk (written or deleted); a lab already up to date is not rewritten.
    """
    solutions, labs = _solutions_folder(solutions_dir), Path(labs_dir)
    labs.mkdir(parents=True, exist_ok=True)
    changed = []
    for solution in _notebooks(solutions):
        lab = labs / solution.name
        data = render_lab(solution).encode("utf-8")
        if not lab.is_file() or lab.read_bytes() != data:
            lab.write_bytes(data)
            changed.append(lab)
    for lab in _notebooks(labs):
        if not (solutions / lab.name).is_file():
            lab.unlink()
            changed.append(lab)
    return changed


def stale_labs(solutions_dir: str | Path = "solutions", labs_dir: str | Path = "labs") -> list[str]:
    """Names of the labs that are missing, differ from what `build_labs` would write, or have no solution.

    An empty list means labs/ is in sync with solutions/.
    """
    solutions, labs = _solutions_folder(solutions_dir), Path(labs_dir)
    stale = []
    for solution in _notebooks(solutions):
        lab = labs / solution.name
        if not lab.is_file() or lab.read_bytes() != render_lab(solution).encode("utf-8"):
            stale.append(solution.name)
    stale += [lab.name for lab in _notebooks(labs) if not (solutions / lab.name).is_file()]
    return sorted(stale)


def stale_message(stale: Sequence[str], labs_dir: str | Path = "labs", solutions_dir: str | Path = "solutions") -> str:
    """What `check` prints when `stale` is not empty."""
    labs, solutions = f"{Path(labs_dir).as_posix()}/", f"{Path(solutions_dir).as_posix()}/"
    return (f"{labs} is out of sync with {solutions}: {', '.join(stale)}. "
            f"Run `make labs` and commit {labs}.")


def main(argv: Sequence[str] | None = None) -> int:
    """`build` writes labs/ from solutions/; `check` exits 1 when labs/ is stale."""
    parser = argparse.ArgumentParser(prog="python -m course_lib.authoring", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command, summary in (("build", "write labs/ from solutions/"), ("check", "exit 1 if labs/ is stale")):
        sub = commands.add_parser(command, help=summary)
        sub.add_argument("--solutions", default="solutions", help="solution notebooks (default: solutions)")
        sub.add_argument("--labs", default="labs", help="student notebooks (default: labs)")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            changed = build_labs(args.solutions, args.labs)
            for path in changed:
                print(f"{'wrote' if path.exists() else 'removed'} {path.as_posix()}")
            print(f"labs: {len(changed)} changed" if changed else f"labs: {args.labs}/ already up to date")
            return 0
        stale = stale_labs(args.solutions, args.labs)
    except (ValueError, FileNotFoundError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    if stale:
        print(stale_message(stale, args.labs, args.solutions), file=sys.stderr)
        return 1
    print(f"labs: {args.labs}/ is in sync with {args.solutions}/")
    return 0


# --------------------------------------------------------------------------------------------- helpers

def _language(nb: NotebookNode, name: str) -> str:
    metadata = nb.get("metadata", {})
    language = (metadata.get("kernelspec", {}).get("language")
                or metadata.get("language_info", {}).get("name")
                or "python")
    if language.lower() != "python":
        raise ValueError(f"{name}: the labs are Python notebooks; this one's kernel language is {language!r}")
    return "python"


def _check_regions(nb: NotebookNode, name: str) -> None:
    """Raise ValueError for a BEGIN without END, an END without BEGIN, or a nested BEGIN, in any cell."""
    for index, cell in enumerate(nb.cells):
        for begin, end in (SOLUTION_DELIMITERS, HIDDEN_TESTS_DELIMITERS):
            open_line = None
            begin_mark, end_mark = f"### {begin}", f"### {end}"  # as authors write them
            for number, line in enumerate(cell.source.split("\n"), start=1):
                if begin in line:  # the same substring test nbgrader applies
                    if open_line is not None:
                        raise ValueError(f"{name}, cell {index}: '{begin_mark}' on line {number} is nested inside the "
                                         f"one on line {open_line}; close it with '{end_mark}' first")
                    open_line = number
                elif end in line:
                    if open_line is None:
                        raise ValueError(f"{name}, cell {index}: '{end_mark}' on line {number} has no "
                                         f"'{begin_mark}' before it")
                    open_line = None
            if open_line is not None:
                raise ValueError(f"{name}, cell {index}: '{begin_mark}' on line {open_line} has no matching "
                                 f"'{end_mark}'")


def _derived_id(name: str, index: int) -> str:
    return hashlib.sha1(f"{name}#{index}".encode()).hexdigest()[:8]


def _normalise(nb: NotebookNode, name: str) -> NotebookNode:
    """A fresh v4.5 notebook with the same cells, only kept metadata, and a fixed notebook metadata."""
    cells, seen = [], set()
    for index, cell in enumerate(nb.cells):
        cell_id = cell.get("id") or _derived_id(name, index)
        if cell_id in seen:  # duplicated ids (pasted cells) would make the lab invalid
            cell_id = _derived_id(name, index)
        seen.add(cell_id)
        metadata = {key: copy.deepcopy(cell.metadata[key]) for key in KEPT_CELL_METADATA if key in cell.metadata}
        if cell.cell_type == "code":
            new = nbformat.v4.new_code_cell(cell.source, id=cell_id, metadata=metadata)
        elif cell.cell_type == "markdown":
            new = nbformat.v4.new_markdown_cell(cell.source, id=cell_id, metadata=metadata)
        else:
            new = nbformat.v4.new_raw_cell(cell.source, id=cell_id, metadata=metadata)
        if cell.cell_type != "code" and cell.get("attachments"):
            new.attachments = copy.deepcopy(cell.attachments)
        cells.append(new)
    lab = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": dict(KERNELSPEC),
                                                          "language_info": dict(LANGUAGE_INFO)})
    lab.nbformat, lab.nbformat_minor = 4, 5
    nbformat.validate(lab)
    return lab


def _solutions_folder(solutions_dir: str | Path) -> Path:
    solutions = Path(solutions_dir)
    if not solutions.is_dir():
        raise FileNotFoundError(f"no solutions folder at {solutions.resolve()}; run from the repository root "
                                f"or pass --solutions")
    return solutions


def _notebooks(folder: Path) -> list[Path]:
    """The notebooks directly in `folder`, sorted; checkpoints and hidden files excluded."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.ipynb") if p.is_file() and not p.name.startswith("."))


if __name__ == "__main__":
    sys.exit(main())
