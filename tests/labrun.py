"""Run a student copy top to bottom as a learner would, with its exercises skipped or answered.

    python tests/labrun.py labs/08_checkpointing.ipynb            # every exercise skipped
    python tests/labrun.py labs/08_checkpointing.ipynb --answers  # the solutions' answers written in

Prints each cell that raised, and the lines where a check put the course's reference answer in place of a
skipped one. ``tests/test_skip_path.py`` asserts on the same run.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from course_lib.progress import CHECK_CALL  # every labNN.check_...( call: one exercise

REPO = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class CellError:
    cell_id: str
    ename: str
    evalue: str
    text: str
    is_check: bool
    expected: bool  # tagged to fail on purpose


@dataclass
class LabRun:
    lab: str
    seconds: float
    errors: list[CellError] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)  # (check cell id, the "↪" line)

    @property
    def cascading(self) -> list[CellError]:
        """Errors in cells that neither check an exercise nor are tagged to fail: what a skip must not cause."""
        return [e for e in self.errors if not e.is_check and not e.expected]


def with_answers(lab: nbformat.NotebookNode, solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """`lab` with each exercise cell's source replaced by the solution's cell of the same id."""
    sources = {cell.get("id"): cell.source for cell in solution.cells}
    for cell in lab.cells:
        if cell.cell_type == "code" and "raise NotImplementedError()" in cell.source and cell.get("id") in sources:
            cell.source = sources[cell.id]
    return lab


@contextlib.contextmanager
def _environment(**values: str):
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def run_lab(path: Path, answers: bool = False, progress_file: Path | None = None, timeout: int = 600) -> LabRun:
    """Execute the student copy at `path` in a fresh kernel started in its folder, errors allowed."""
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    if answers:
        nb = with_answers(nb, nbformat.read(REPO / "solutions" / path.name, as_version=4))
    progress_file = progress_file or Path(tempfile.mkdtemp(prefix="labrun-")) / ".progress.json"
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(path.parent)}})
    start = time.monotonic()
    with _environment(COURSE_PROGRESS_FILE=str(progress_file), COURSE_PROGRESS="text"):
        client.execute()
    run = LabRun(path.stem, time.monotonic() - start)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        for output in cell.get("outputs", []):
            if output.get("output_type") != "error":
                continue
            text = ANSI.sub("", "\n".join(output.get("traceback", [])))
            run.errors.append(CellError(cell.get("id", ""), output["ename"], output["evalue"], text,
                                        CHECK_CALL.search(cell.source) is not None,
                                        "raises-exception" in cell.metadata.get("tags", [])))
            run.fallbacks += [(cell.get("id", ""), line.strip()) for line in text.splitlines() if "↪" in line]
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("labs", nargs="+", type=Path)
    parser.add_argument("--answers", action="store_true", help="write the solutions' answers in")
    args = parser.parse_args(argv)
    bad = 0
    for path in args.labs:
        run = run_lab(path, answers=args.answers)
        print(f"{run.lab}: {run.seconds:.0f} s, {len(run.errors)} cells raised, {len(run.cascading)} cascading")
        for error in run.errors:
            kind = "check" if error.is_check else "on purpose" if error.expected else "CASCADE"
            print(f"  [{error.cell_id}] {kind}: {error.ename}: {error.evalue.splitlines()[0] if error.evalue else ''}"[:240])
        for cell_id, line in run.fallbacks:
            print(f"  [{cell_id}] {line}")
        bad += len(run.cascading)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
