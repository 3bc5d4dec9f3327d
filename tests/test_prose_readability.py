"""The labs' prose stays readable (issue 34): short sentences, flat parentheses, sources out of the sentences.

The figures are `course_lib.prose`'s (the same as `python -m course_lib.prose solutions/*.ipynb ERRORS.md`):
markdown cells of the solution notebooks, and the sentences of ERRORS.md's table cells.

- A lab in ``REWRITTEN`` has been rewritten for learners and is held to ``LIMITS``: mean sentence length at
  most 18 words, at most 3 % of its sentences over 40 words, no parenthesis inside a parenthesis, no
  paragraph over 120 words, and no package source path inside a sentence (sources go on the section's
  "In the source:" line, which tests/test_source_references.py checks item by item).
- Every other lab is held to a ratchet: its figures may not get worse than ``RECORDED``, what it measured on
  the day this test was written, so an edit cannot drift back while its rewrite waits.
- A lab in neither (a new one) is held to ``LIMITS``.

When you have rewritten a lab, uncomment its line in ``REWRITTEN`` (one line per lab, blank lines between, so
rewrites made in parallel merge without conflict); leave its ``RECORDED`` line as the record of where it started.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import pytest

from course_lib.prose import Stats, measure, measure_file

REPO = Path(__file__).resolve().parents[1]
LABS = {path.stem: path for path in sorted((REPO / "solutions").glob("*.ipynb"))} | {"ERRORS": REPO / "ERRORS.md"}

REWRITTEN = frozenset([
    "00_setup",

    "ERRORS",

    "01_collectives",

    "02_embeddings",

    "03_sharding",

    "04_dmp",

    "05_sparse_optimizers",

    "06_fsdp",

    "07_hybrid",

    "08_checkpointing",

    "09_scale",

    "10_new_ids",

    "11_cheaper",

    "12_llm_era",
])


@dataclass(frozen=True)
class Figures:
    """The figures a lab is held to: each is the most it may have."""

    mean: float  # words per sentence
    share_over_40: float  # per cent of sentences over 40 words
    nested: int  # sentences with a parenthesis inside a parenthesis
    paragraphs_over_120: int  # paragraphs (and list items) over 120 words
    inline_paths: int  # package source paths inside the prose rather than on an "In the source:" line


LIMITS = Figures(mean=18.0, share_over_40=3.0, nested=0, paragraphs_over_120=0, inline_paths=0)

# Measured on 2026-12-08 at b7f2d0f, before the rewrites (mean and share rounded up to two decimals).
RECORDED = {
    "00_setup": Figures(mean=22.5, share_over_40=5.56, nested=1, paragraphs_over_120=1, inline_paths=20),
    "01_collectives": Figures(mean=21.89, share_over_40=11.86, nested=12, paragraphs_over_120=0, inline_paths=31),
    "02_embeddings": Figures(mean=22.14, share_over_40=8.93, nested=0, paragraphs_over_120=4, inline_paths=23),
    "03_sharding": Figures(mean=23.24, share_over_40=12.5, nested=5, paragraphs_over_120=4, inline_paths=33),
    "04_dmp": Figures(mean=25.62, share_over_40=16.19, nested=2, paragraphs_over_120=5, inline_paths=29),
    "05_sparse_optimizers": Figures(mean=28.1, share_over_40=21.6, nested=2, paragraphs_over_120=7, inline_paths=29),
    "06_fsdp": Figures(mean=24.45, share_over_40=14.38, nested=10, paragraphs_over_120=5, inline_paths=43),
    "07_hybrid": Figures(mean=26.82, share_over_40=21.22, nested=6, paragraphs_over_120=3, inline_paths=22),
    "08_checkpointing": Figures(mean=27.91, share_over_40=18.19, nested=4, paragraphs_over_120=5, inline_paths=47),
    "09_scale": Figures(mean=29.33, share_over_40=21.48, nested=2, paragraphs_over_120=9, inline_paths=29),
    "10_new_ids": Figures(mean=27.46, share_over_40=19.21, nested=1, paragraphs_over_120=8, inline_paths=50),
    "11_cheaper": Figures(mean=27.22, share_over_40=18.43, nested=2, paragraphs_over_120=6, inline_paths=36),
    "12_llm_era": Figures(mean=26.51, share_over_40=20.87, nested=0, paragraphs_over_120=5, inline_paths=24),
    "ERRORS": Figures(mean=17.92, share_over_40=2.57, nested=1, paragraphs_over_120=0, inline_paths=0),
}


def figures_of(stats: Stats) -> Figures:
    return Figures(mean=stats.mean, share_over_40=100 * stats.share_over(40), nested=len(stats.nested),
                   paragraphs_over_120=stats.paragraphs_over_120, inline_paths=stats.inline_paths)


def offenders(stats: Stats, figure: str, n: int = 3) -> list[str]:
    """The first sentences (or paragraphs) that make `figure` what it is."""
    return {"mean": stats.longest(n), "share_over_40": stats.long_sentences[:n], "nested": stats.nested[:n],
            "paragraphs_over_120": stats.long_paragraphs[:n], "inline_paths": stats.path_sentences[:n]}[figure]


def failures(lab: str, stats: Stats, bound: Figures, kind: str) -> list[str]:
    """One message per figure of `stats` over `bound`: the lab, the figure, its value, the bound, the offenders."""
    found, measured = [], figures_of(stats)
    for f in fields(Figures):
        value, most = getattr(measured, f.name), getattr(bound, f.name)
        if value > most + 1e-9:
            shown = "\n".join(f"      - {text[:240]}" for text in offenders(stats, f.name))
            value = f"{value:.2f}" if isinstance(value, float) else value
            found.append(f"{lab}: {f.name} is {value}, the {kind} is {most}; first offenders:\n{shown}")
    return found


def bound_of(lab: str) -> tuple[Figures, str]:
    if lab in REWRITTEN or lab not in RECORDED:
        return LIMITS, "limit for a rewritten lab"
    return RECORDED[lab], "figure recorded before its rewrite (it may not get worse)"


@pytest.mark.parametrize("lab", sorted(LABS))
def test_the_prose_of_each_lab_is_within_its_limits(lab):
    bound, kind = bound_of(lab)
    problems = failures(lab, measure_file(LABS[lab]), bound, kind)
    assert not problems, "\n" + "\n".join(problems)


def test_the_rewritten_set_names_labs_that_exist():
    assert REWRITTEN <= set(LABS), f"no such lab: {sorted(REWRITTEN - set(LABS))}"


def test_every_row_of_the_errors_index_is_measured():
    """ERRORS.md's prose is its table's "cause and fix" cells: a row whose cell holds no sentence (no final
    full stop) would escape the measure, so every row must add one paragraph."""
    text = LABS["ERRORS"].read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) >= 50
    table_only = "\n".join(rows)
    assert len(measure(table_only, tables=True).paragraphs) == len(rows)


# ------------------------------------------------------------------------------------ the measure itself


def _stats(markdown: str) -> Stats:
    return measure(markdown)


def test_a_long_sentence_a_nested_parenthesis_and_an_inline_path_are_each_reported():
    long = " ".join(["word"] * 45) + "."
    text = (f"{long} A short one (with a note (inside a note)). It cites `torchrec/distributed/dist_data.py` here.\n\n"
            "*In the source:* `KJTAllToAll` in `torchrec/distributed/dist_data.py`")
    stats = _stats(text)
    problems = "\n".join(failures("lab", stats, LIMITS, "limit"))
    assert "lab: share_over_40 is 33.33, the limit is 3.0" in problems and "word word" in problems
    assert "lab: nested is 1, the limit is 0" in problems and "inside a note" in problems
    assert "lab: inline_paths is 1, the limit is 0" in problems and "It cites" in problems
    assert stats.source_lines == 1  # the source line's path is not an inline path


def test_a_long_paragraph_is_reported_and_short_prose_passes():
    sentence = "This sentence has exactly ten words in it, no more. "
    assert "paragraphs_over_120" in "\n".join(failures("lab", _stats(sentence * 13), LIMITS, "limit"))
    assert failures("lab", _stats(sentence * 3 + "\n\n" + sentence * 3), LIMITS, "limit") == []


def test_the_ratchet_fails_a_lab_that_gets_worse_than_recorded():
    recorded = Figures(mean=12.0, share_over_40=0.0, nested=0, paragraphs_over_120=0, inline_paths=0)
    assert failures("lab", _stats("Ten words here and ten words there, and no more. " * 2), recorded, "record") == []
    worse = failures("lab", _stats("A sentence of twenty words, which is longer than the ones this lab had "
                                   "when its figures were first recorded."), recorded, "record")
    assert len(worse) == 1 and worse[0].startswith("lab: mean is 20.00, the record is 12.0")


def test_table_cells_are_prose_in_a_markdown_file_and_labels_are_not():
    table = ("| message | where | cause and fix |\n|---|---|---|\n"
             "| `some error.` | [lab §1](labs/x.ipynb), cell `c1` | The cause. The fix, in `code`. |\n")
    assert measure(table).sentences == []  # a notebook's table is data
    assert measure(table, tables=True).sentences == [2, 4]  # only the cause-and-fix cell
