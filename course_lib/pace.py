"""How long a lab takes a learner, estimated the same way for every lab, so that each header's time is honest
and one lab that is out of line with the rest shows up.

A lab's time is the sum of four parts, each counted from the solution notebook:

- reading the prose: the words of its markdown cells at ``PROSE_WORDS_PER_MINUTE`` (technical reading with
  the code beside it is slower than the 250 words a minute of plain reading);
- reading and running the code: its non-blank code lines at ``CODE_LINES_PER_MINUTE``;
- the exercises: ``MINUTES_PER_EXERCISE`` for each markdown heading that starts an exercise;
- waiting for the cells: the run time the notebook recorded when it was last executed (nbconvert stores
  each cell's start and end in ``metadata.execution``), measured, not estimated.

    python -m course_lib.pace              # the table, one row per solution notebook
    python -m course_lib.pace --write      # and rewrite each header's "**Time:**" sentence from it

``tests/test_pace.py`` holds every header's "about N minutes" to this estimate.
"""
from __future__ import annotations

import argparse
import datetime
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import nbformat
from nbformat import NotebookNode

PROSE_WORDS_PER_MINUTE = 200
CODE_LINES_PER_MINUTE = 20
MINUTES_PER_EXERCISE = 6
EXERCISE_HEADING = re.compile(r"^#{1,6}\s.*\bExercise\b", re.MULTILINE)
STATED = re.compile(r"\*\*Time:\*\*\s*about (\d+) minutes")


@dataclass(frozen=True)
class Pace:
    """The four parts of a lab's time, in minutes, and what they were counted from."""

    words: int
    code_lines: int
    exercises: int
    run_seconds: float

    @property
    def reading(self) -> float:
        return self.words / PROSE_WORDS_PER_MINUTE

    @property
    def code(self) -> float:
        return self.code_lines / CODE_LINES_PER_MINUTE

    @property
    def exercising(self) -> float:
        return self.exercises * MINUTES_PER_EXERCISE

    @property
    def running(self) -> float:
        return self.run_seconds / 60

    @property
    def minutes(self) -> float:
        return self.reading + self.code + self.exercising + self.running

    def rounded(self) -> int:
        """The estimate to the nearest 5 minutes, as a header states it."""
        return max(5, 5 * round(self.minutes / 5))


def pace(nb: NotebookNode) -> Pace:
    """Count a solution notebook's words, code lines, exercises and recorded run time."""
    markdown = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    return Pace(
        words=sum(len(source.split()) for source in markdown),
        code_lines=sum(1 for cell in code for line in cell.source.splitlines() if line.strip()),
        exercises=sum(len(EXERCISE_HEADING.findall(source)) for source in markdown),
        run_seconds=sum(_cell_seconds(cell) for cell in code),
    )


TIME_SENTENCE = re.compile(r"\*\*Time:\*\*.*?\.(?=\s|$)", re.DOTALL)


def _run_phrase(seconds: float) -> str:
    if seconds < 60:
        return "under a minute"
    if seconds < 90:
        return "about a minute"
    return f"about {round(seconds / 60)} minutes"


def time_sentence(p: Pace) -> str:
    """The header's time sentence for a lab counted as `p`."""
    return (f"**Time:** about {p.rounded()} minutes: reading about {round(p.reading + p.code)}, the "
            f"{p.exercises} exercises about {round(p.exercising)}, and the cells ran in {_run_phrase(p.run_seconds)} "
            "when this notebook was last executed on a 2-core machine (every lab is counted the same way: "
            "`python -m course_lib.pace`).")


def write_time(nb: NotebookNode) -> bool:
    """Replace the first cell's time sentence with :func:`time_sentence`; return whether it changed."""
    head = nb.cells[0]
    new = TIME_SENTENCE.sub(lambda _: time_sentence(pace(nb)), head.source, count=1)
    changed = new != head.source
    head.source = new
    return changed


def stated_minutes(nb: NotebookNode) -> int | None:
    """The "**Time:** about N minutes" of the notebook's first cell, or None when it states none."""
    match = STATED.search(nb.cells[0].source) if nb.cells else None
    return int(match.group(1)) if match else None


def _cell_seconds(cell: NotebookNode) -> float:
    timing = cell.get("metadata", {}).get("execution", {})
    start, end = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not start or not end:
        return 0.0
    parse = datetime.datetime.fromisoformat
    return max(0.0, (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.pace", description=__doc__.split("\n")[0])
    parser.add_argument("notebooks", nargs="*", default=sorted(str(p) for p in Path("solutions").glob("*.ipynb")))
    parser.add_argument("--write", action="store_true", help="rewrite each header's time sentence from the count")
    args = parser.parse_args(argv)
    if args.write:
        for path in args.notebooks:
            nb = nbformat.read(path, as_version=4)
            if write_time(nb):
                nbformat.write(nb, path)
                print(f"wrote {path}")
    print(f"{'lab':<28}{'words':>7}{'code':>6}{'ex':>4}{'run s':>7}  reading+code+exercises+run = estimate  stated")
    for path in args.notebooks:
        nb = nbformat.read(path, as_version=4)
        p = pace(nb)
        print(f"{Path(path).stem:<28}{p.words:>7}{p.code_lines:>6}{p.exercises:>4}{p.run_seconds:>7.0f}  "
              f"{p.reading:5.1f} +{p.code:5.1f} +{p.exercising:3.0f} +{p.running:4.1f} = {p.minutes:5.1f} "
              f"(~{p.rounded()})  {stated_minutes(nb)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
