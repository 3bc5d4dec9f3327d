"""The tolerant comparison of stored notebook outputs (course_lib.tolerance) and its nbval plugin."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from course_lib.tolerance import Declared, Tolerance, compare, declared_tolerance, figures

AUC = Tolerance(absolute=0.002)


def test_equal_outputs_agree():
    assert compare("model AUC 0.7983, 438 steps", "model AUC 0.7983, 438 steps", AUC) == []


def test_a_figure_within_the_tolerance_agrees():
    assert compare("model AUC 0.7983\ngap: 0.0096", "model AUC 0.7982\ngap: 0.0095", AUC) == []


def test_a_figure_moved_past_the_tolerance_fails_and_is_named():
    problems = compare("model AUC 0.7983, gap 0.0096", "model AUC 0.7950, gap 0.0096", AUC)
    assert len(problems) == 1
    assert "stored 0.7983, now 0.7950" in problems[0] and "±0.002" in problems[0]


def test_a_changed_word_next_to_a_tolerant_figure_fails():
    assert compare("gap: 0.0096  ->  within 0.02 of the optimum", "gap: 0.0096  ->  outside 0.02 of the optimum", AUC)
    assert compare("model AUC 0.7983", "model NE 0.7983", AUC)


def test_whole_numbers_are_compared_exactly():
    # counts, bytes and steps are deterministic: a tolerance never covers them
    assert compare("438 steps per rank", "437 steps per rank", Tolerance(absolute=10))
    assert compare("tensors 109,220 B", "tensors 109,221 B", Tolerance(relative=0.5))


def test_the_number_of_decimals_is_part_of_the_text():
    assert compare("AUC 0.7983", "AUC 0.798", AUC)
    assert compare("error 1.6e-05", "error 0.000016", Tolerance(absolute=1))


def test_a_table_that_realigns_around_a_longer_figure_agrees():
    stored = "INT8   9.774  0.7725\nINT4  12.101  0.7724"
    new = "INT8  10.167  0.7725\nINT4  12.101  0.7723"
    assert compare(stored, new, Tolerance(relative=0.05)) == []
    assert compare(stored, new, Tolerance(absolute=0.002))  # 9.774 -> 10.167 is past ±0.002


def test_relative_and_absolute_tolerances_take_the_larger():
    both = Tolerance(absolute=0.001, relative=0.02)
    assert both.allows(10.0, 10.19) and not both.allows(10.0, 10.3)
    assert both.allows(0.01, 0.0109) and not both.allows(0.01, 0.012)


def test_signs_and_negative_zero():
    assert compare("AUC - fp32: -0.0001", "AUC - fp32: 0.0000", AUC) == []
    assert compare("AUC - fp32: -0.0001", "AUC - fp32: -0.0100", AUC)


def test_numbers_glued_to_words_and_versions_stay_text():
    skeleton, found, _ = figures("fp32 t_user2 torch 2.13.0 loss=0.4930 (-48%)")
    assert found == ["0.4930"]
    assert "fp32" in skeleton and "t_user2" in skeleton and "2.13.0" in skeleton and "-48" in skeleton


def test_the_declared_tolerance_is_read_from_a_comment():
    assert declared_tolerance("x = 1\nprint(x)") is None
    assert declared_tolerance("# tolerance: ±0.002 (AUCs move in the 4th decimal)\nprint(auc)") == Declared(Tolerance(0.002))
    assert declared_tolerance("  # tolerance: ±5%\n") == Declared(Tolerance(0, 0.05))
    assert declared_tolerance("# tolerance: ±0.001 ±2% (both)") == Declared(Tolerance(0.001, 0.02))
    # the reason in parentheses is not read as an amount
    assert declared_tolerance("# tolerance: ±0.002 (not ±50%)") == Declared(Tolerance(0.002))
    assert declared_tolerance('# tolerance: ±0.002; ±10% after "logit diff" (why)') == Declared(
        Tolerance(0.002), (("logit diff", Tolerance(0, 0.1)),))


@pytest.mark.parametrize("comment", ["# tolerance: a little", "# tolerance: 0.002", "# tolerance: ±0.002 or so",
                                     '# tolerance: ±1% after "a"; ±0.002'])
def test_a_tolerance_comment_that_cannot_be_read_is_an_error(comment):
    with pytest.raises(ValueError, match="tolerance"):
        declared_tolerance(comment)


def test_figures_of_another_kind_on_a_line_get_their_own_tolerance():
    declared = declared_tolerance('# tolerance: ±0.002; ±10% after "logit diff"')
    stored = "max |logit diff|  0.0016  1.9331\nAUC               0.7725  0.7616"
    assert compare(stored, "max |logit diff|  0.0017  2.0031\nAUC               0.7729  0.7610", declared) == []
    # an AUC may not borrow the logits' 10%, nor a logit diff move past it
    assert compare(stored, "max |logit diff|  0.0016  1.9331\nAUC               0.7725  0.7316", declared)
    assert compare(stored, "max |logit diff|  0.0016  2.5000\nAUC               0.7725  0.7616", declared)


def test_in_an_html_table_a_rule_covers_the_figures_of_its_row():
    declared = declared_tolerance('# tolerance: ±0.002; ±10% after "logit diff"')
    row = "<tr>\n  <th>{label}</th>\n  <td>{a}</td>\n  <td>{b}</td>\n</tr>\n"
    stored = row.format(label="max |logit diff|", a="0.0016", b="1.9331") + row.format(label="AUC", a="0.7725", b="0.7616")
    assert compare(stored, row.format(label="max |logit diff|", a="0.0016", b="2.0031")
                   + row.format(label="AUC", a="0.7729", b="0.7616"), declared) == []
    assert compare(stored, row.format(label="max |logit diff|", a="0.0016", b="1.9331")
                   + row.format(label="AUC", a="0.7725", b="0.7916"), declared)


def test_without_a_leading_amount_only_the_named_figures_may_move():
    declared = declared_tolerance('# tolerance: ±0.01 after "scores"')
    assert compare("AUC 0.7725\nscores [0.1250]", "AUC 0.7725\nscores [0.1315]", declared) == []
    assert compare("AUC 0.7725\nscores [0.1250]", "AUC 0.7726\nscores [0.1250]", declared)


# ------------------------------------------------------------------ the nbval plugin on a real notebook
CODE = 'print("model AUC {:.4f} after {} steps".format({auc}, 438))'


def notebook(tmp_path, source: str, stored_text: str):
    cell = {"cell_type": "code", "execution_count": 1, "id": "c1", "metadata": {}, "source": source,
            "outputs": [{"output_type": "stream", "name": "stdout", "text": stored_text}]}
    nb = {"cells": [cell], "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                       "language": "python"}},
          "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "figures.ipynb"
    path.write_text(json.dumps(nb))
    return path


def nbval(path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "course_lib.nbval_tolerance",
         "--nbval", "--nbval-current-env", "-o", "addopts=", "-o", "filterwarnings=", str(path)],
        capture_output=True, text=True, timeout=120, cwd=path.parent)


@pytest.mark.slow
def test_nbval_accepts_a_figure_within_the_cells_tolerance_and_refuses_one_beyond(tmp_path):
    declared = "# tolerance: ±0.002 (AUCs move with the CPU)\n" + CODE.replace("{auc}", "0.7982")
    within = nbval(notebook(tmp_path, declared, "model AUC 0.7983 after 438 steps\n"))
    assert within.returncode == 0, within.stdout[-2000:]

    beyond = nbval(notebook(tmp_path, declared, "model AUC 0.7950 after 438 steps\n"))
    assert beyond.returncode == 1, beyond.stdout[-2000:]
    assert "stored 0.7950, now 0.7982" in beyond.stdout and "±0.002" in beyond.stdout

    reworded = nbval(notebook(tmp_path, declared, "model NE 0.7983 after 438 steps\n"))
    assert reworded.returncode == 1 and "text around the figures differs" in reworded.stdout

    count = nbval(notebook(tmp_path, declared, "model AUC 0.7983 after 437 steps\n"))
    assert count.returncode == 1


@pytest.mark.slow
def test_nbval_compares_a_cell_without_a_declared_tolerance_exactly(tmp_path):
    undeclared = CODE.replace("{auc}", "0.7982")
    result = nbval(notebook(tmp_path, undeclared, "model AUC 0.7983 after 438 steps\n"))
    assert result.returncode == 1, result.stdout[-2000:]
    assert nbval(notebook(tmp_path, undeclared, "model AUC 0.7982 after 438 steps\n")).returncode == 0


# ------------------------------------------------------------------ the course's own notebooks
def declared_cells():
    import nbformat
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[1] / "solutions").glob("*.ipynb")):
        for index, cell in enumerate(nbformat.read(path, as_version=4).cells):
            if cell.cell_type == "code" and "# tolerance:" in cell.source:
                yield f"{path.name}[{index}]", cell


@pytest.mark.parametrize("name,cell", list(declared_cells()), ids=lambda value: value if isinstance(value, str) else "")
def test_each_declared_tolerance_reads_and_covers_a_figure(name, cell):
    declared = declared_tolerance(cell.source)
    assert declared is not None
    shown = "".join(o.get("text", "") + "".join(v for k, v in o.get("data", {}).items() if k.startswith("text/"))
                    for o in cell.outputs)
    _, found, contexts = figures(shown)
    covered = [figure for figure, context in zip(found, contexts) if declared.for_figure(context) != Tolerance()]
    assert covered, f"{name} declares {declared} but its stored outputs have no decimal figure it covers"
