"""A check run from a notebook records its verdict, and puts the course's reference answer in place of one
that does not pass; a check run from anywhere else (a test, a script) does neither."""
from __future__ import annotations

import json
from pathlib import Path

from course_lib import progress
from course_lib.checks import lab00

REPO = Path(__file__).resolve().parents[1]

RIGHT = ("def fix_for(report):\n"
         "    diagnosis = next(line for line in report.splitlines() if line.startswith('✗'))\n"
         "    return 3 if 'lockstep' in diagnosis else 2 if 'fbgemm-gpu' in diagnosis else 5\n")
WRONG = "def fix_for(report):\n    return 3\n"  # right for a torch out of lockstep only
STUB = "def fix_for(report):\n    # YOUR CODE HERE\n    raise NotImplementedError()\n"
CHECK = "lab00.check_fix_for(fix_for)"
REPORT_B = "str(lab00.broken_reports()['B'])"


def _lines(cell) -> str:
    return "\n".join(cell.error["traceback"]) if cell.error else cell.stdout


def test_a_pass_a_later_failure_and_an_untouched_exercise(kernel, tmp_path: Path):
    record = tmp_path / ".progress.json"
    kernel.run(f"import os\nos.environ['COURSE_PROGRESS_FILE'] = {str(record)!r}\nfrom course_lib.checks import lab00")

    kernel.run(RIGHT)
    passed = kernel.run(CHECK)
    assert passed.error is None and passed.stdout.startswith("✓"), _lines(passed)
    entry = json.loads(record.read_text())["00"]["check_fix_for"]
    assert entry["verdict"] == "passed" and entry["last_passed"] == entry["last_run"] and entry["answer"] == "fix_for"
    report = progress.report(REPO / "labs", record)
    assert "00_setup: 1 of 3" in report and "✓ exercise 1" in report and "last passed" in report
    assert "· exercise 2" in report and "not started" in report  # never checked

    kernel.run(WRONG)  # the learner changes a passing answer
    failed = kernel.run(CHECK)
    text = _lines(failed)
    assert failed.ename == "CheckFailed" and "report C: fix 3 does not cure it" in text
    assert "(this exercise passed at" in text  # the check says it passed before
    assert "↪ until yours passes, the cells below use the course's reference `fix_for`" in text
    entry = json.loads(record.read_text())["00"]["check_fix_for"]
    assert entry["verdict"] == "failed" and entry["last_passed"] < entry["last_run"] or entry["verdict"] == "failed"
    report = progress.report(REPO / "labs", record)
    assert "00_setup: 0 of 3" in report and "✗ exercise 1" in report and "fails now" in report and "it passed" in report

    # the cells below now get the reference's answer, and the check does not take it for the learner's
    value = kernel.run("print(fix_for(str(lab00.broken_reports()['C'])))")
    assert value.stdout.strip() == "5"
    again = kernel.run(CHECK)
    assert again.ename == "CheckFailed" and "is the course's reference answer, not yours" in _lines(again)
    assert json.loads(record.read_text())["00"]["check_fix_for"]["verdict"] == "failed"  # not counted as a pass
    # a table filled with the answer after the check labels it as the reference's, not the learner's
    assert kernel.run("from course_lib.checks import whose\nprint(whose(fix_for))").stdout.strip() == "reference"

    kernel.run(RIGHT)  # the learner's own answer always wins once its cell runs again
    assert kernel.run(CHECK).stdout.startswith("✓")
    assert kernel.run("print(whose(fix_for), whose(fix_for, len))").stdout.strip() == "your your"
    assert "00_setup: 1 of 3" in progress.report(REPO / "labs", record)


def test_an_unwritten_exercise_stays_not_started_and_the_reference_stands_in(kernel, tmp_path: Path):
    record = tmp_path / ".progress.json"
    kernel.run(f"import os\nos.environ['COURSE_PROGRESS_FILE'] = {str(record)!r}\nfrom course_lib.checks import lab00")
    kernel.run(STUB)
    cell = kernel.run(CHECK)
    text = _lines(cell)
    assert cell.ename == "CheckFailed" and "fix_for is not written yet" in text
    assert "↪ meanwhile the cells below use the course's reference `fix_for`" in text
    assert "return {" not in text  # the reference's code is not shown
    assert kernel.run(f"print(fix_for({REPORT_B}))").stdout.strip() == "3"
    assert json.loads(record.read_text())["00"]["check_fix_for"]["verdict"] == "unwritten"
    assert "· exercise 1" in progress.report(REPO / "labs", record)


def test_a_check_called_outside_a_notebook_records_nothing(tmp_path: Path, monkeypatch):
    record = tmp_path / ".progress.json"
    monkeypatch.setenv("COURSE_PROGRESS_FILE", str(record))
    lab00.check_fix_for(lambda report: 3 if "lockstep" in report else 2 if "✗ the CUDA fbgemm" in report else 5)
    assert not record.exists()


def test_a_progress_file_that_cannot_be_written_never_breaks_a_check(tmp_path: Path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    assert progress.record("00", "check_fix_for", "passed", path=blocked / ".progress.json") is None


def test_the_record_keeps_the_last_pass_through_a_failure(tmp_path: Path):
    record = tmp_path / ".progress.json"
    progress.record("08", "check_save", "passed", "save", path=record)
    before = progress.record("08", "check_save", "failed", "save", path=record)
    assert before["verdict"] == "passed"
    entry = progress.load(record)["08"]["check_save"]
    assert entry["verdict"] == "failed" and entry["last_passed"] == before["last_passed"]


def _solutions_with(folder: Path, exercise_source: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(exercise_source, id="ex1"), nbformat.v4.new_code_cell(CHECK, id="ck1")]
    nbformat.write(nb, folder / "00_setup.ipynb")


def test_without_a_reference_or_with_a_broken_one_the_check_says_what_the_cells_below_need(kernel, tmp_path: Path):
    empty, broken = tmp_path / "empty", tmp_path / "broken"
    empty.mkdir()
    broken.mkdir()
    _solutions_with(broken, "### BEGIN SOLUTION\ndef fix_for(report):\n    return given_above\n### END SOLUTION\nundefined_name\n")
    kernel.run(f"import os\nos.environ['COURSE_PROGRESS_FILE'] = {str(tmp_path / 'p.json')!r}\n"
               "from course_lib.checks import lab00")
    kernel.run(STUB)
    kernel.run(f"os.environ['COURSE_SOLUTIONS'] = {str(empty)!r}")
    text = _lines(kernel.run(CHECK))
    assert "fix_for is not written yet" in text and "↪ no reference answer here to use instead" in text
    kernel.run(f"os.environ['COURSE_SOLUTIONS'] = {str(broken)!r}")
    text = _lines(kernel.run(CHECK))
    assert "↪ the course's reference answer could not stand in (NameError: name 'undefined_name'" in text
