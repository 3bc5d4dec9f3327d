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

The references of a section or of a claim-heavy cell live on one line at its end, out of the sentences:

    *In the source:* `_init_default_mesh` in `torch/distributed/fsdp/_fully_shard/_fsdp_init.py`; `torch/distributed/fsdp/_fully_shard/_fully_shard.py`: "parameters are all-gathered in one collective"

That line is read strictly. Its items, separated by ";", must each be one whole reference in one of these forms:

    `name` in `path`            `path`: `fragment`            `path`: "quoted text"            "quoted text", `path`

An item in none of these forms (a typo, a missing backtick, a path without a fragment) fails the test, so a
mistake on that line cannot hide the way a loose sentence would. Its paths may also be the course's own files
(`course_lib/...`, `tools/...`), which are looked up in the repository. References still inside sentences are
found by the looser reading above.
"""
from __future__ import annotations

import re
import sysconfig
from pathlib import Path

import nbformat
import pytest

from course_lib.prose import SOURCE_LINE

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

# The "In the source" line (`*In the source:*`, **bold**, _underlined_ or unmarked, then its items): one definition,
# shared with course_lib.prose, which leaves these lines out of the prose it measures.
COURSE_DIRS = ("course_lib", "tools", "tests", "requirements", "cluster", "benchmarks")
ITEM_PATH = r"`(?P<path>(?:%s)/[\w/.-]+\.\w+)`" % "|".join(PACKAGES + COURSE_DIRS)
ITEM_FORMS = (
    re.compile(r"^`(?P<fragment>[^`]+)` in %s$" % ITEM_PATH),  # `name` in `path`
    re.compile(r"^%s: `(?P<fragment>[^`]+)`$" % ITEM_PATH),  # `path`: `fragment`
    re.compile(r"^%s: \"(?P<fragment>[^\"]+)\"$" % ITEM_PATH),  # `path`: "quoted text"
    re.compile(r"^\"(?P<fragment>[^\"]+)\", %s$" % ITEM_PATH),  # "quoted text", `path`
)


def _split_items(items: str) -> list[str]:
    """The items of an "In the source" line: split at ";" outside backticks and double quotes."""
    parts, current, code, quoted = [], "", False, False
    for char in items:
        if char == "`" and not quoted:
            code = not code
        elif char == '"' and not code:
            quoted = not quoted
        if char == ";" and not code and not quoted:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [part.strip() for part in parts]


def source_line_items(text: str) -> list[dict[str, str | None]]:
    """The items of every "In the source" line in `text`: path and fragment, or the unparsable item itself."""
    found = []
    for line in SOURCE_LINE.finditer(text):
        items = line.group("items").strip()
        items = items[:-1].rstrip() if items.endswith(".") else items  # a final full stop, outside any item
        for item in _split_items(items):
            hit = next((m for form in ITEM_FORMS if (m := form.match(item))), None)
            found.append({"path": hit.group("path"), "fragment": hit.group("fragment")} if hit else
                         {"path": None, "fragment": None, "unparsable": item})
    return found


def references(text: str) -> list[dict[str, str | None]]:
    """The source references in a piece of markdown: path, and the fragment to look for (None if it names none).

    "In the source" lines are read strictly (`source_line_items`); the rest of the text loosely, as sentences."""
    found = source_line_items(text)
    text = SOURCE_LINE.sub("", text)
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
    if "unparsable" in reference:
        return (f"In the source: cannot read {reference['unparsable']!r}: write each item as `name` in `path`, "
                f"`path`: `fragment`, `path`: \"quoted text\" or \"quoted text\", `path`, separated by \";\"")
    path, fragment = reference["path"], reference["fragment"]
    course_file = str(path).split("/")[0] in COURSE_DIRS
    file = (REPO if course_file else site) / str(path)
    if not file.is_file():
        return f"`{path}` is not in the {'repository' if course_file else 'installed packages'}"
    if fragment is None:
        return f"`{path}` is cited without a name or quoted fragment to look for"
    source = file.read_text(encoding="utf-8", errors="replace")
    if "(" in fragment and fragment in source:  # a call quoted word for word: `grad_input.div_(n)`
        return None
    if NAME.match(fragment) and file.suffix == ".py":
        parts = fragment.split("(")[0].split(".")
        missing = [part for part in parts if not _defined(part, source)]
        return f"`{path}` does not define {', '.join(missing)} (cited as `{fragment}`)" if missing else None
    return None if fragment in source else f"`{path}` does not contain {fragment!r}"


def notebook_references() -> list[tuple[str, str, dict[str, str | None]]]:
    """(notebook, cell id, reference) for every reference in the solutions' markdown, and in ERRORS.md."""
    found = []
    for path in sorted((REPO / "solutions").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "markdown":
                found += [(path.stem, cell.id, ref) for ref in references(cell.source)]
    found += [("ERRORS.md", "-", ref) for ref in references((REPO / "ERRORS.md").read_text(encoding="utf-8"))]
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


def test_a_call_quoted_word_for_word_holds():
    text = '*In the source:* `torchrec/distributed/comm_ops.py`: "grad_input.div_(dist.get_world_size(ctx.pg))"'
    assert [problem(ref) for ref in references(text)] == [None]


def test_a_holding_reference_is_not_reported():
    for text in ("(`KJTAllToAll` in `torchrec/distributed/dist_data.py`)",
                 "(`DistributedSampler.__iter__` in `torch/utils/data/distributed.py`)",
                 "(`default_pg_timeout` in `torch/distributed/constants.py`)",
                 "(`torch/optim/optimizer.py`: `raise ValueError(\"optimizer got an empty parameter list\")`)"):
        assert [problem(ref) for ref in references(text)] == [None], text


# ------------------------------------------------------------------------------- the "In the source" line

GOOD_LINE = ('*In the source:* `KJTAllToAll` in `torchrec/distributed/dist_data.py`; '
             '`torch/optim/optimizer.py`: `raise ValueError("optimizer got an empty parameter list")`; '
             '`torch/distributed/distributed_c10d.py`: "in a way that all get the final result"; '
             '"exclusive access to every GPU", `torch/distributed/distributed_c10d.py`')


def test_a_good_in_the_source_line_is_read_item_by_item_and_holds():
    items = source_line_items("Some prose.\n\n" + GOOD_LINE + "\n")
    assert [item["fragment"] for item in items] == [
        "KJTAllToAll", 'raise ValueError("optimizer got an empty parameter list")',
        "in a way that all get the final result", "exclusive access to every GPU"]
    assert [problem(ref) for ref in references(GOOD_LINE)] == [None] * 4


@pytest.mark.parametrize("line", [
    "**In the source:** `KJTAllToAll` in `torchrec/distributed/dist_data.py`.",
    "In the source: `KJTAllToAll` in `torchrec/distributed/dist_data.py`",
    "_In the source:_ `KJTAllToAll` in `torchrec/distributed/dist_data.py`",
    "*In the source*: `KJTAllToAll` in `torchrec/distributed/dist_data.py`",
    "*In the source:* `launch` in `course_lib/launcher/launch.py`",
    '*In the source:* `tools/setup_venv.sh`: "--no-deps"',
])
def test_the_in_the_source_line_may_be_marked_and_end_as_prose_does(line):
    assert [problem(ref) for ref in references(line)] == [None], line


@pytest.mark.parametrize("line, words", [
    ("*In the source:* `KJTAllToAll` in `torchrec/distributed/no_such_file.py`", "is not in the installed packages"),
    ("*In the source:* `NoSuchClass` in `torchrec/distributed/dist_data.py`", "does not define NoSuchClass"),
    ('*In the source:* `torch/optim/optimizer.py`: "a sentence torch never wrote"', "does not contain"),
    ("*In the source:* `torchrec/distributed/dist_data.py`", "cannot read"),  # a path with nothing to look for
    ("*In the source:* `KJTAllToAll` at `torchrec/distributed/dist_data.py`", "cannot read"),  # not a form
    ("*In the source:* `KJTAllToAll` in torchrec/distributed/dist_data.py", "cannot read"),  # a missing backtick
    ("*In the source:* `KJTAllToAll` in `torchrec/distributed/dist_data.py`, `KJTAllToAll` in "
     "`torchrec/distributed/dist_data.py`", "cannot read"),  # "," where ";" separates items
    ("*In the source:* `launch` in `course_lib/launcher/no_such_module.py`", "is not in the repository"),
    ('*In the source:* `torchrec/distributed/comm_ops.py`: "grad_input.div_(a_world_size_never_used)"',
     "does not define div_"),  # a call is read word for word first, then as names
])
def test_a_broken_or_unparsable_item_in_the_in_the_source_line_fails(line, words):
    found = [problem(ref) or "" for ref in references(GOOD_LINE + "\n\n" + line)]
    assert found[:4] == [""] * 4, "the good line's items must still hold"
    assert len(found) >= 5 and any(words in why for why in found[4:]), found


def test_a_semicolon_inside_a_quoted_fragment_does_not_split_the_item():
    items = source_line_items('*In the source:* `torch/x.py`: `a; b`; "c; d", `torch/y.py`')
    assert [(item["path"], item["fragment"]) for item in items] == [("torch/x.py", "a; b"), ("torch/y.py", "c; d")]


def test_sentences_keep_their_loose_reading_beside_a_source_line():
    text = "A sentence (`KJTAllToAll` in `torchrec/distributed/dist_data.py`).\n\n" + GOOD_LINE
    assert len(references(text)) == 5 and [problem(ref) for ref in references(text)] == [None] * 5
