"""A learner's path through the course: skip an exercise and keep going, and see what is done.

Every student copy runs top to bottom twice in a fresh kernel started in labs/: once with no exercise written,
where only the exercises' own checks (each saying "not written yet") and the cells tagged to fail on purpose
may raise, and once with the solutions' answers written in, where only the tagged cells may. A lab runs
alone: no earlier lab has run in its kernel. The checks record their verdicts in a progress file of the
test's own, which ``python -m course_lib.progress`` then reads.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from course_lib import progress, reference

sys.path.insert(0, str(Path(__file__).parent))
from labrun import CHECK_CALL, run_lab  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
LABS = sorted((REPO / "labs").glob("[0-9][0-9]_*.ipynb"))
EXERCISES = progress.exercises(REPO / "labs")
ANSWERED = {}  # lab stem -> progress file of its run with the solutions' answers


def _ids(path: Path) -> str:
    return path.stem


def _described(errors) -> str:
    return "\n".join(f"  [{e.cell_id}] {e.ename}: {e.evalue.splitlines()[0] if e.evalue else ''}" for e in errors)


def test_every_check_has_a_reference_answer_that_the_student_copy_leaves_out():
    assert len(EXERCISES) >= 46, [e.check for e in EXERCISES]
    for exercise in EXERCISES:
        cell = reference.reference_cell(exercise.lab, exercise.check)
        lab_cells = {c.get("id"): c for c in nbformat.read(REPO / "labs" / f"{exercise.notebook}.ipynb", as_version=4).cells}
        assert cell.cell_id in lab_cells, (exercise, cell.cell_id)
        stub = lab_cells[cell.cell_id].source
        assert "raise NotImplementedError()" in stub and "BEGIN SOLUTION" not in stub, (exercise, cell.cell_id)
        assert cell.answers, (exercise, cell.cell_id)


def test_a_check_cell_holds_only_its_check():
    """Code after a check in its own cell would not run when the check fails, and the cells below would miss it."""
    for path in LABS:
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and CHECK_CALL.search(cell.source):
                after = cell.source[CHECK_CALL.search(cell.source).start():].split("\n")[1:]
                code = [line for line in after if line.strip() and not line.strip().startswith(("#", ")"))]
                assert not code, f"{path.name} [{cell.get('id')}]: code after the check: {code}"


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=_ids)
def test_a_lab_with_every_exercise_skipped_runs_to_its_end(lab: Path, tmp_path: Path):
    run = run_lab(lab, progress_file=tmp_path / ".progress.json")
    assert not run.cascading, f"{lab.name}: cells that failed because an exercise was skipped:\n{_described(run.cascading)}"
    checks = [e for e in run.errors if e.is_check]
    mine = [e for e in EXERCISES if e.notebook == lab.stem]
    assert len(checks) == len(mine), _described(checks)
    assert all("is not written yet" in e.text for e in checks), _described(checks)
    assert len(run.fallbacks) == len(mine), run.fallbacks  # each says the reference stands in
    assert all("reference" in line for _, line in run.fallbacks)
    print(f"{lab.stem}: {run.seconds:.0f} s; fell back at " + ", ".join(cell for cell, _ in run.fallbacks))
    assert f"{lab.stem}: 0 of {len(mine)}" in progress.report(REPO / "labs", tmp_path / ".progress.json")


@pytest.mark.slow
@pytest.mark.parametrize("lab", LABS, ids=_ids)
def test_a_lab_with_the_solutions_answers_runs_clean(lab: Path, tmp_path_factory):
    progress_file = tmp_path_factory.mktemp("answered") / ".progress.json"
    run = run_lab(lab, answers=True, progress_file=progress_file)
    unexpected = [e for e in run.errors if not e.expected]
    assert not unexpected, f"{lab.name} with the solutions' answers:\n{_described(unexpected)}"
    assert not run.fallbacks
    mine = [e for e in EXERCISES if e.notebook == lab.stem]
    assert f"{lab.stem}: {len(mine)} of {len(mine)}" in progress.report(REPO / "labs", progress_file)
    ANSWERED[lab.stem] = progress_file


def test_progress_counts_every_exercise_once_all_labs_ran_with_answers(tmp_path: Path):
    if set(ANSWERED) != {lab.stem for lab in LABS}:
        pytest.skip("needs every lab's run with the solutions' answers (the slow tests above) in this session")
    merged = {}
    for progress_file in ANSWERED.values():
        merged.update(progress.load(progress_file))
    combined = tmp_path / ".progress.json"
    combined.write_text(__import__("json").dumps(merged))
    out = _progress_command("--file", str(combined))
    assert out.splitlines()[-1] == f"{len(EXERCISES)} of {len(EXERCISES)} exercises passed"


def _progress_command(*args: str) -> str:
    done = subprocess.run([sys.executable, "-m", "course_lib.progress", "--labs", str(REPO / "labs"), *args],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_progress_on_a_fresh_clone_says_nothing_is_done_yet(tmp_path: Path):
    out = _progress_command("--file", str(tmp_path / "none.json"))
    assert out.splitlines()[-1] == f"0 of {len(EXERCISES)} exercises passed"
    assert "00_setup: 0 of 3" in out and "· exercise 1" in out


def test_make_progress_runs_the_command():
    makefile = (REPO / "Makefile").read_text()
    assert "\nprogress: setup\n\t@$(PY) -m course_lib.progress --labs labs\n" in makefile
    assert ".progress.json" in (REPO / ".gitignore").read_text().split()
