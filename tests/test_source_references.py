"""Every place a lab points at in the installed torch / torchrec / fbgemm_gpu source still says what the lab says.

A lab backs a sentence about a library with a reference a learner can open in their own .venv: the file, as
a path inside site-packages in backticks, and what to look for in it, written in one of three ways:

    (`_maybe_compute_length_per_key` in `torchrec/sparse/jagged_tensor.py`)     a name defined in the file
    (`torch/optim/optimizer.py`: `raise ValueError("optimizer got an empty")`)  a fragment quoted from it
    ("Factory Class for generating TorchScript", `torchrec/inference/dlrm_predict.py`)   quoted text

A dotted name (`DistributedSampler.__iter__`, `KeyedOptimizerWrapper.__init__`) must have every part defined
in the file (``def``, ``class`` or an assignment); anything else in backticks, or in double quotes, must
appear in it word for word. This test fails when a file is gone, a name is no longer defined there or a
fragment no longer appears, and when a reference names a file but nothing to look for: after a version bump
it lists exactly the sentences to read again.
"""
from __future__ import annotations

import re
import sysconfig
from pathlib import Path

import nbformat
import pytest

REPO = Path(__file__).resolve().parents[1]
SITE = Path(sysconfig.get_paths()["purelib"])
PACKAGES = ("torch", "torchrec", "fbgemm_gpu", "torchmetrics")

PATH = r"`(?P<path>(?:%s)/[\w/.]+\.py)`" % "|".join(PACKAGES)
# `name` in `path` | `path`: `fragment` | `path`, `fragment` | `path` (`fragment` | "quoted text", `path`
BEFORE = re.compile(r"`(?P<fragment>[^`]+)` (?:in|of) $")
# a quoted text opens a parenthesis, or an item of an "In the source:" line (after its colon or a "; ")
QUOTED_BEFORE = re.compile(r"(?:\(|:\*{0,2} |; )\"(?P<fragment>[^\"]+)\", $")
AFTER = re.compile(r"^(?::|,|\s\()\s?`(?P<fragment>[^`]+)`")
NAME = re.compile(r"^[A-Za-z_][\w.]*(?:\(.*\))?$")


def references(text: str) -> list[dict[str, str | None]]:
    """The source references in a piece of markdown: path, and the fragment to look for (None if it names none)."""
    found = []
    for match in re.finditer(PATH, text):
        before, after = text[: match.start()], text[match.end():]
        fragment = None
        for pattern, where in ((BEFORE, before[-200:]), (QUOTED_BEFORE, before[-300:]), (AFTER, after[:300])):
            if (hit := pattern.search(where)) is not None:
                fragment = hit.group("fragment")
                break
        found.append({"path": match.group("path"), "fragment": fragment})
    return found


def _defined(name: str, source: str) -> bool:
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b|^\s*{re.escape(name)}\s*[:=]",
                     source, re.MULTILINE) is not None


def problem(reference: dict[str, str | None], site: Path = SITE) -> str | None:
    """Why a reference does not hold in the installed packages, or None when it does."""
    path, fragment = reference["path"], reference["fragment"]
    file = site / str(path)
    if not file.is_file():
        return f"`{path}` is not in the installed packages"
    if fragment is None:
        return f"`{path}` is cited without a name or quoted fragment to look for"
    source = file.read_text(encoding="utf-8", errors="replace")
    if NAME.match(fragment):
        parts = fragment.split("(")[0].split(".")
        missing = [part for part in parts if not _defined(part, source)]
        return f"`{path}` does not define {', '.join(missing)} (cited as `{fragment}`)" if missing else None
    return None if fragment in source else f"`{path}` does not contain {fragment!r}"


def notebook_references() -> list[tuple[str, str, dict[str, str | None]]]:
    """(notebook, cell id, reference) for every reference in the solutions' markdown."""
    found = []
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                found += [(path.stem, cell.id, ref) for ref in references(cell.source)]
    return found


def test_every_reference_in_the_labs_holds_in_the_installed_packages():
    found = notebook_references()
    assert len(found) >= 20, "the labs cite fewer source files than they did: did the reference format change?"
    broken = [f"{notebook} cell {cell}: {why}" for notebook, cell, ref in found if (why := problem(ref))]
    assert not broken, "references to re-read:\n" + "\n".join(broken)


# ------------------------------------------------------------------------------------ the checker itself


@pytest.mark.parametrize("text, path, fragment", [
    ("(`_evict` in `torchrec/distributed/mc_embedding_modules.py`)", "torchrec/distributed/mc_embedding_modules.py", "_evict"),
    ("(`torch/optim/optimizer.py`: `raise ValueError(\"x\")`)", "torch/optim/optimizer.py", "raise ValueError(\"x\")"),
    ("(`torch/utils/data/distributed.py`, `indices += indices[:padding_size]`)", "torch/utils/data/distributed.py",
     "indices += indices[:padding_size]"),
    ("(\"Factory Class for generating\", `torchrec/inference/dlrm_predict.py`)", "torchrec/inference/dlrm_predict.py",
     "Factory Class for generating"),
    ("`torchrec/inference/client.py` (`stub = x`) is", "torchrec/inference/client.py", "stub = x"),
    ("*In the source:* \"Factory Class for generating\", `torchrec/inference/dlrm_predict.py`",
     "torchrec/inference/dlrm_predict.py", "Factory Class for generating"),
    ("see `torchrec/distributed/sharding_plan.py` for more", "torchrec/distributed/sharding_plan.py", None),
])
def test_references_are_read_with_their_fragment(text, path, fragment):
    assert references(text) == [{"path": path, "fragment": fragment}]


def test_an_in_the_source_line_is_read_item_by_item():
    line = ("*In the source:* `_evict` in `torchrec/distributed/mc_embedding_modules.py`; `torch/optim/optimizer.py`: "
            "`raise ValueError(\"x\")`; \"Factory Class for generating\", `torchrec/inference/dlrm_predict.py`")
    assert references(line) == [
        {"path": "torchrec/distributed/mc_embedding_modules.py", "fragment": "_evict"},
        {"path": "torch/optim/optimizer.py", "fragment": "raise ValueError(\"x\")"},
        {"path": "torchrec/inference/dlrm_predict.py", "fragment": "Factory Class for generating"},
    ]


@pytest.mark.parametrize("text, words", [
    ("(`KJTAllToAll` in `torchrec/distributed/no_such_file.py`)", "is not in the installed packages"),
    ("(`NoSuchClass.forward` in `torchrec/distributed/dist_data.py`)", "does not define NoSuchClass"),
    ("(`torch/optim/optimizer.py`: `raise ValueError(\"a message torch never wrote\")`)", "does not contain"),
    ("(`torchrec/distributed/dist_data.py`)", "without a name or quoted fragment"),
    ("(`forward` in `torchrec/distributed/dist_data.py`: a name used but defined elsewhere would pass, so "
     "`KJTAllToAll.no_such_method` in `torchrec/distributed/dist_data.py`)", "does not define no_such_method"),
])
def test_a_broken_reference_is_reported(text, words):
    assert any(words in (problem(ref) or "") for ref in references(text))


def test_a_holding_reference_is_not_reported():
    for text in ("(`KJTAllToAll` in `torchrec/distributed/dist_data.py`)",
                 "(`DistributedSampler.__iter__` in `torch/utils/data/distributed.py`)",
                 "(`default_pg_timeout` in `torch/distributed/constants.py`)",
                 "(`torch/optim/optimizer.py`: `raise ValueError(\"optimizer got an empty parameter list\")`)"):
        assert [problem(ref) for ref in references(text)] == [None], text
