"""solutions/ -> labs/: what the student copy keeps and drops, and the check that labs/ is fresh."""
from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from course_lib.authoring import (KERNELSPEC, build_labs, main, make_lab, render_lab, stale_labs,
                                  stale_message)

REPO = Path(__file__).resolve().parents[1]

EXERCISE = """\
import torch

def double(x):
    ### BEGIN SOLUTION
    y = x * 2
    return y
    ### END SOLUTION

print("defined")"""

CHECK = """\
assert double(1) == 2, "double(1) should be 2"
### BEGIN HIDDEN TESTS
assert double(21) == 42
### END HIDDEN TESTS
print("double: correct")"""

ANSWER = """\
Why does it double?

### BEGIN SOLUTION
Because it multiplies by two.
### END SOLUTION"""


def solution_notebook() -> nbformat.NotebookNode:
    """An executed solution as an author's Jupyter leaves it: outputs, counts, and noisy metadata."""
    cells = [
        new_markdown_cell("# 99 · Test lab", id="intro",
                          metadata={"jp-MarkdownHeadingCollapsed": True, "tags": ["intro"]}),
        new_code_cell(EXERCISE, id="exercise", execution_count=3,
                      outputs=[new_output("stream", name="stdout", text="defined\n")],
                      metadata={"execution": {"iopub.execute_input": "2026-12-03T06:29:11.867673Z"},
                                "collapsed": False, "scrolled": True, "editable": True,
                                "nbgrader": {"solution": True, "grade_id": "ex1"}}),
        new_code_cell(CHECK, id="check", execution_count=4,
                      outputs=[new_output("stream", name="stdout", text="double: correct\n"),
                               new_output("execute_result", data={"text/plain": "0x7f3a"}, execution_count=4)],
                      metadata={"tags": ["raises-exception"], "deletable": False, "trusted": True}),
        new_markdown_cell(ANSWER, id="answer"),
    ]
    return new_notebook(cells=cells, metadata={
        "kernelspec": {"display_name": "Python 3.11 (course)", "language": "python", "name": "course"},
        "language_info": {"name": "python", "version": "3.11.7", "pygments_lexer": "ipython3"},
        "celltoolbar": "Create Assignment",
        "widgets": {"application/vnd.jupyter.widget-state+json": {"state": {}}},
    })


def write_solution(folder: Path, name: str = "99_test.ipynb", nb: nbformat.NotebookNode | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    nbformat.write(nb if nb is not None else solution_notebook(), path)
    return path


def test_stub_replaces_only_the_solution_region():
    lab = make_lab(solution_notebook(), name="99_test.ipynb")
    assert lab.cells[1].source == (
        "import torch\n\ndef double(x):\n"
        "    # YOUR CODE HERE\n    raise NotImplementedError()\n"
        "\nprint(\"defined\")"
    )


def test_markdown_solution_region_becomes_the_text_stub():
    lab = make_lab(solution_notebook(), name="99_test.ipynb")
    assert lab.cells[3].source == "Why does it double?\n\nYOUR ANSWER HERE"


def test_hidden_tests_are_dropped_and_the_rest_of_the_check_stays():
    lab = make_lab(solution_notebook(), name="99_test.ipynb")
    assert lab.cells[2].source == 'assert double(1) == 2, "double(1) should be 2"\nprint("double: correct")'
    assert "42" not in nbformat.writes(lab)


def test_outputs_counts_and_metadata_are_normalised_and_ids_kept():
    solution = solution_notebook()
    lab = make_lab(solution, name="99_test.ipynb")
    assert [c.id for c in lab.cells] == ["intro", "exercise", "check", "answer"]
    for cell in lab.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None
    assert [dict(c.metadata) for c in lab.cells] == [
        {"tags": ["intro"]}, {"editable": True}, {"tags": ["raises-exception"], "deletable": False}, {}]
    assert dict(lab.metadata) == {"kernelspec": KERNELSPEC, "language_info": {"name": "python"}}
    assert (lab.nbformat, lab.nbformat_minor) == (4, 5)
    assert "nbgrader" not in nbformat.writes(lab)
    assert solution.cells[1].outputs and "BEGIN SOLUTION" in solution.cells[1].source  # input untouched


def test_cells_without_ids_get_deterministic_ones():
    solution = solution_notebook()
    solution.nbformat_minor = 4
    for cell in solution.cells:
        del cell["id"]
    ids = [c.id for c in make_lab(solution, name="99_test.ipynb").cells]
    assert ids == [c.id for c in make_lab(solution, name="99_test.ipynb").cells]
    assert len(set(ids)) == len(ids)
    assert ids != [c.id for c in make_lab(solution, name="98_other.ipynb").cells]


def test_render_is_byte_identical_across_runs_and_to_nbformat_write(tmp_path):
    path = write_solution(tmp_path / "solutions")
    first, second = render_lab(path), render_lab(path)
    assert first == second
    nbformat.write(make_lab(nbformat.read(path, as_version=4), name=path.name), tmp_path / "direct.ipynb")
    assert first.encode("utf-8") == (tmp_path / "direct.ipynb").read_bytes()
    # re-executing the solution (new outputs, counts, timestamps) does not change the lab
    rerun = solution_notebook()
    rerun.cells[1].execution_count = 17
    rerun.cells[1].metadata["execution"] = {"iopub.execute_input": "2027-01-01T00:00:00Z"}
    rerun.metadata["language_info"]["version"] = "3.11.9"
    assert render_lab(write_solution(tmp_path / "rerun", nb=rerun)) == first


@pytest.mark.parametrize("source, fault", [
    ("x = 1\n### BEGIN SOLUTION\nx = 2", "'### BEGIN SOLUTION' on line 2 has no matching '### END SOLUTION'"),
    ("x = 1\n### END SOLUTION", "'### END SOLUTION' on line 2 has no '### BEGIN SOLUTION' before it"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "nested"),
    ("ok = True\n### BEGIN HIDDEN TESTS\nassert ok", "has no matching '### END HIDDEN TESTS'"),
])
def test_unmatched_markers_raise_naming_the_notebook_and_cell(tmp_path, source, fault):
    solution = solution_notebook()
    solution.cells.insert(2, new_code_cell(source, id="broken"))
    path = write_solution(tmp_path / "solutions", "42_broken.ipynb", solution)
    with pytest.raises(ValueError, match=r"42_broken\.ipynb, cell 2: ") as error:
        render_lab(path)
    assert fault in str(error.value)


def test_stale_labs_is_empty_after_build(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write_solution(solutions)
    write_solution(solutions, "98_other.ipynb")
    assert stale_labs(solutions, labs) == ["98_other.ipynb", "99_test.ipynb"]  # never built
    assert build_labs(solutions, labs) == [labs / "98_other.ipynb", labs / "99_test.ipynb"]
    assert stale_labs(solutions, labs) == []
    assert build_labs(solutions, labs) == []  # nothing rewritten when up to date


def test_changed_solution_without_rebuild_makes_its_lab_stale(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write_solution(solutions)
    write_solution(solutions, "98_other.ipynb")
    build_labs(solutions, labs)
    changed = solution_notebook()
    changed.cells[0].source += "\n\nA new sentence."
    write_solution(solutions, nb=changed)
    assert stale_labs(solutions, labs) == ["99_test.ipynb"]
    assert build_labs(solutions, labs) == [labs / "99_test.ipynb"]
    assert stale_labs(solutions, labs) == []


def test_solution_rerun_without_source_change_keeps_lab_fresh(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write_solution(solutions)
    build_labs(solutions, labs)
    rerun = solution_notebook()
    rerun.cells[2].outputs = [new_output("stream", name="stdout", text="different\n")]
    write_solution(solutions, nb=rerun)
    assert stale_labs(solutions, labs) == []


def test_hand_edited_lab_is_stale(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write_solution(solutions)
    build_labs(solutions, labs)
    lab = nbformat.read(labs / "99_test.ipynb", as_version=4)
    lab.cells[1].source = lab.cells[1].source.replace("raise NotImplementedError()", "return 2 * x")
    nbformat.write(lab, labs / "99_test.ipynb")
    assert stale_labs(solutions, labs) == ["99_test.ipynb"]


def test_lab_without_solution_is_stale_and_build_removes_it(tmp_path):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write_solution(solutions)
    build_labs(solutions, labs)
    (solutions / "99_test.ipynb").rename(solutions / "97_renamed.ipynb")
    (labs / ".ipynb_checkpoints").mkdir()
    (labs / ".ipynb_checkpoints" / "99_test-checkpoint.ipynb").write_text("{}")
    assert stale_labs(solutions, labs) == ["97_renamed.ipynb", "99_test.ipynb"]
    assert sorted(build_labs(solutions, labs)) == [labs / "97_renamed.ipynb", labs / "99_test.ipynb"]
    assert sorted(p.name for p in labs.glob("*.ipynb")) == ["97_renamed.ipynb"]
    assert stale_labs(solutions, labs) == []


def test_cli_check_and_build(tmp_path, capsys):
    solutions, labs = tmp_path / "solutions", tmp_path / "labs"
    write_solution(solutions)
    args = ["--solutions", str(solutions), "--labs", str(labs)]
    assert main(["check", *args]) == 1
    assert f"is out of sync with {solutions.as_posix()}/: 99_test.ipynb. Run `make labs`" in capsys.readouterr().err
    assert main(["build", *args]) == 0
    assert "wrote" in capsys.readouterr().out
    assert main(["check", *args]) == 0


def test_stale_message_wording():
    assert stale_message(["01_a.ipynb", "02_b.ipynb"]) == (
        "labs/ is out of sync with solutions/: 01_a.ipynb, 02_b.ipynb. Run `make labs` and commit labs/.")


def test_committed_labs_are_in_sync():
    stale = stale_labs(REPO / "solutions", REPO / "labs")
    assert not stale, stale_message(stale)


def test_nbval_markers_are_dropped_from_labs():
    from course_lib.authoring import make_lab

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("# NBVAL_IGNORE_OUTPUT\nimport time\nprint(time.time())  # NBVAL_IGNORE_OUTPUT stays")]
    lab = make_lab(nb, name="markers.ipynb")
    assert lab.cells[0].source == "import time\nprint(time.time())  # NBVAL_IGNORE_OUTPUT stays"
