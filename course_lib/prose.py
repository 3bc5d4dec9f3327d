"""Readability figures of the course's prose: words, sentence lengths, nested parentheses, long paragraphs.

Measured on the markdown cells of a notebook, or on a markdown file, the way issue 34 defines them:

- fenced code blocks, HTML comments and headings are left out; inline code counts as one word, a link by its
  text; a list item is a paragraph of its own;
- a sentence ends at . ! or ? before a space and what can open a sentence ("e.g.", "i.e.", "vs", "etc" and
  decimals do not end one);
- "In the source:" lines are not prose: they are counted apart, so a section's citations can live there
  without weighing on its sentences. `SOURCE_LINE` is the one definition of that line; the reference test
  (tests/test_source_references.py) reads the same lines strictly;
- tables: in a notebook a table is data (figures, code, a plan) and is left out. In a markdown file such as
  ERRORS.md the table *is* the prose, so each body row is read cell by cell and a cell that holds a sentence
  (outside inline code, it ends in . ! or ?, maybe before a closing quote or bracket) is measured as a paragraph of its
  own. Cells that are labels, an error message in backticks or a link to a lab cell, hold no sentence and
  are left out: counted as one- or ten-word sentences they would only pull the mean down.

    python -m course_lib.prose solutions/*.ipynb ERRORS.md        # one line per file, then the total
    python -m course_lib.prose --long 40 solutions/06_fsdp.ipynb  # also list the sentences over 40 words

(`tools/prose_stats.py` runs the same command.) tests/test_prose_readability.py holds the labs to limits.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# `*In the source:* items`, also **bold**, _underlined_, unmarked, or as a list item; one line, items after the colon.
SOURCE_LINE = re.compile(r"^\s*(?:[-*+]\s+)?(?P<mark>[*_]{0,2})In the source(?::(?P=mark)|(?P=mark):)\s*(?P<items>.*)$",
                         re.IGNORECASE | re.MULTILINE)
PACKAGE_PATH = re.compile(r"`(?:torch|torchrec|fbgemm_gpu|torchmetrics)/[\w/.]+\.py")
# A sentence ends at . ! ? (optionally followed by a closing quote or bracket) before whitespace and what can
# open a sentence; "e.g." / "i.e." and decimals do not end one.
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\bvs)(?<!\betc)[.!?][\"')\]]*\s+(?=[\"'(\[`*_]*[A-Z0-9`])")


@dataclass
class Stats:
    """Figures of one text: each sentence's word count, paragraphs' word counts, and what breaks the reading."""

    sentences: list[int] = field(default_factory=list)
    paragraphs: list[int] = field(default_factory=list)
    nested: list[str] = field(default_factory=list)
    inline_paths: int = 0
    source_lines: int = 0
    long_sentences: list[str] = field(default_factory=list)
    long_paragraphs: list[str] = field(default_factory=list)  # the paragraphs over 120 words
    path_sentences: list[str] = field(default_factory=list)  # the sentences with a package source path in them
    texts: list[str] = field(default_factory=list)  # each sentence, in the order of `sentences`

    @property
    def words(self) -> int:
        return sum(self.sentences)

    @property
    def mean(self) -> float:
        return self.words / len(self.sentences) if self.sentences else 0.0

    def over(self, limit: int) -> int:
        return sum(1 for n in self.sentences if n > limit)

    def share_over(self, limit: int) -> float:
        return self.over(limit) / len(self.sentences) if self.sentences else 0.0

    @property
    def paragraphs_over_120(self) -> int:
        return sum(1 for p in self.paragraphs if p > 120)

    def longest(self, n: int = 3) -> list[str]:
        """The `n` longest sentences, longest first."""
        return [t for _, t in sorted(zip(self.sentences, self.texts), key=lambda pair: -pair[0])[:n]]

    def add(self, other: "Stats") -> None:
        self.sentences += other.sentences
        self.paragraphs += other.paragraphs
        self.nested += other.nested
        self.inline_paths += other.inline_paths
        self.source_lines += other.source_lines
        self.long_sentences += other.long_sentences
        self.long_paragraphs += other.long_paragraphs
        self.path_sentences += other.path_sentences
        self.texts += other.texts


CELL_SENTENCE = re.compile(r"[.!?][\"')\]]*$")  # tested on the cell with its inline code taken out


def _table_cells(row: str) -> list[str]:
    """The cells of a table row that hold a sentence (see the module docstring), split at | outside backticks."""
    cells, current, code = [], "", False
    for char in row.strip().strip("|"):
        if char == "`":
            code = not code
        if char == "|" and not code:
            cells.append(current.strip())
            current = ""
        else:
            current += char
    cells.append(current.strip())
    return [cell for cell in cells if CELL_SENTENCE.search(re.sub(r"`[^`]*`", "CODE", cell))]


def _prose_blocks(markdown: str, tables: bool = False) -> tuple[list[str], int]:
    """The paragraphs of `markdown` that are prose (list items are paragraphs of their own), and how many
    "In the source" lines it has. With `tables`, a table's cells that hold sentences are paragraphs too."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL)
    markdown = re.sub(r"^(```|~~~).*?^\1\s*$", "", markdown, flags=re.DOTALL | re.MULTILINE)
    blocks, current, source_lines = [], [], 0
    for line in markdown.split("\n"):
        stripped = line.strip()
        if SOURCE_LINE.match(stripped):
            source_lines += 1
            stripped = ""
        starts_item = re.match(r"^([-*+]|\d+[.)])\s+", stripped) is not None
        if not stripped or stripped.startswith("#") or stripped.startswith("|") or starts_item:
            if current:
                blocks.append(" ".join(current))
                current = []
            if starts_item:
                current = [re.sub(r"^([-*+]|\d+[.)])\s+", "", stripped)]
            elif tables and stripped.startswith("|") and not re.fullmatch(r"[|:\-\s]+", stripped):
                blocks += _table_cells(stripped)
            continue
        current.append(stripped)
    if current:
        blocks.append(" ".join(current))
    return [b for b in blocks if b.strip()], source_lines


def _words(text: str) -> int:
    text = re.sub(r"`[^`]*`", "CODE", text)  # inline code is one word
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)  # a link counts by its text
    return len(re.findall(r"[\w'’%-]+", text))


def _nesting(text: str) -> bool:
    """Whether `text` has a parenthesis inside a parenthesis (inline code and link targets left out)."""
    text = re.sub(r"`[^`]*`", "CODE", text)
    text = re.sub(r"\]\([^)]*\)", "]", text)
    depth = 0
    for char in text:
        if char == "(":
            depth += 1
            if depth >= 2:
                return True
        elif char == ")":
            depth = max(0, depth - 1)
    return False


def measure(markdown: str, long_limit: int = 40, tables: bool = False) -> Stats:
    """The figures of one markdown text (with `tables`, its tables' sentences too: see the module docstring)."""
    stats = Stats()
    blocks, stats.source_lines = _prose_blocks(markdown, tables)
    for block in blocks:
        stats.inline_paths += len(PACKAGE_PATH.findall(block))
        words = _words(block)
        if not words:
            continue
        stats.paragraphs.append(words)
        if words > 120:
            stats.long_paragraphs.append(block.strip())
        protected = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(".", "\0").replace("?", "\1").replace("!", "\2"), block)
        for sentence in SENTENCE_END.split(protected):
            sentence = sentence.replace("\0", ".").replace("\1", "?").replace("\2", "!")
            n = _words(sentence)
            if not n:
                continue
            stats.sentences.append(n)
            stats.texts.append(sentence.strip())
            if PACKAGE_PATH.search(sentence):
                stats.path_sentences.append(sentence.strip())
            if n > long_limit:
                stats.long_sentences.append(sentence.strip())
            if _nesting(sentence):
                stats.nested.append(sentence.strip())
    return stats


def markdown_of(path: Path) -> list[tuple[str, str]]:
    """(label, markdown) for each markdown cell of a notebook, or the whole of a .md file."""
    if path.suffix == ".ipynb":
        nb = json.loads(path.read_text(encoding="utf-8"))
        return [(cell.get("id", str(i)), "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"])
                for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "markdown"]
    return [("", path.read_text(encoding="utf-8"))]


def measure_file(path: Path, long_limit: int = 40) -> Stats:
    """The figures of a notebook's markdown cells, or of a markdown file with its tables' sentences."""
    total = Stats()
    for _, text in markdown_of(path):
        total.add(measure(text, long_limit, tables=path.suffix != ".ipynb"))
    return total


def line(name: str, s: Stats) -> str:
    return (f"{name:32} words {s.words:6,}  sentences {len(s.sentences):5}  mean {s.mean:5.1f}  "
            f">40 {s.over(40):4} ({100 * s.share_over(40):4.1f} %)  nested {len(s.nested):3}  "
            f"paragraphs >120 {s.paragraphs_over_120:3}  inline paths {s.inline_paths:4}  "
            f"source lines {s.source_lines:3}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.prose", description=__doc__.split("\n")[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--long", type=int, default=0, help="also list sentences over this many words, and nested ones")
    args = parser.parse_args(argv)
    total = Stats()
    for path in args.files:
        s = measure_file(path, args.long or 40)
        total.add(s)
        print(line(path.name, s))
        if args.long:
            for cell, text in markdown_of(path):
                cs = measure(text, args.long, tables=path.suffix != ".ipynb")
                for sentence in cs.long_sentences:
                    print(f"    [{cell}] long ({_words(sentence)}): {sentence[:300]}")
                for sentence in cs.nested:
                    print(f"    [{cell}] nested: {sentence[:300]}")
                for p in cs.paragraphs:
                    if p > 120:
                        print(f"    [{cell}] paragraph of {p} words")
    if len(args.files) > 1:
        print(line("all", total))
    return 0


if __name__ == "__main__":
    sys.exit(main())
