"""Each lab's header states the time `course_lib.pace` estimates for it, and the estimate counts what it says."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from course_lib import pace

REPO = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((REPO / "solutions").glob("*.ipynb"))


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_header_states_the_estimated_time(path):
    nb = nbformat.read(path, as_version=4)
    stated = pace.stated_minutes(nb)
    assert stated is not None, f"{path.name}'s first cell states no '**Time:** about N minutes'"
    estimate = pace.pace(nb)
    assert abs(stated - estimate.minutes) <= max(5.0, 0.15 * estimate.minutes), (
        f"{path.name} says about {stated} minutes; reading {estimate.reading:.0f} + code {estimate.code:.0f} + "
        f"{estimate.exercises} exercises {estimate.exercising:.0f} + running {estimate.running:.1f} = "
        f"{estimate.minutes:.0f} minutes (python -m course_lib.pace)"
    )


def _cell(kind, source, seconds=None):
    cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
    if seconds is not None:
        cell.metadata["execution"] = {"iopub.execute_input": "2026-12-05T04:00:00.000000Z",
                                      "shell.execute_reply": f"2026-12-05T04:00:{seconds:02d}.500000Z"}
    return cell


def test_pace_counts_words_code_lines_exercises_and_recorded_run_time():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("markdown", "# Lab\n**Time:** about 10 minutes"),
        _cell("markdown", "## Exercise 1: a decision\n" + "word " * 394),
        _cell("code", "x = 1\n\n   \ny = 2\n", seconds=30),
        _cell("markdown", "### Exercise 2\nThe exercises above."),  # a heading counts, a mention does not
        _cell("code", "print(x)"),  # not executed: no time recorded
    ])
    p = pace.pace(nb)
    assert (p.words, p.code_lines, p.exercises, p.run_seconds) == (6 + 399 + 6, 3, 2, 30.5)
    assert p.minutes == pytest.approx(411 / 200 + 3 / 20 + 2 * 6 + 30.5 / 60)
    assert p.rounded() == 15 and pace.stated_minutes(nb) == 10


def test_a_notebook_without_a_time_states_none():
    assert pace.stated_minutes(nbformat.v4.new_notebook(cells=[_cell("markdown", "# Lab")])) is None


def test_write_time_rewrites_only_the_time_sentence():
    nb = nbformat.v4.new_notebook(cells=[
        _cell("markdown", "# Lab\n**Prerequisites:** none. **Time:** about 10 minutes; the cells run fast. Next line."),
        _cell("markdown", "## Exercise 1\n" + "word " * 997),
        _cell("code", "x = 1", seconds=45),
    ])
    assert pace.write_time(nb)
    head = nb.cells[0].source
    assert head.startswith("# Lab\n**Prerequisites:** none. **Time:** about 10 minutes: reading about 5, the 1 exercises")
    assert "ran in under a minute" in head and head.endswith("`python -m course_lib.pace`). Next line.")
    assert not pace.write_time(nb)  # a second write changes nothing


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_every_header_has_one_time_sentence_the_tool_can_rewrite(path):
    assert len(pace.TIME_SENTENCE.findall(nbformat.read(path, as_version=4).cells[0].source)) == 1
