#!/usr/bin/env python3
"""Readability figures of the course's prose: words, sentence lengths, nested parentheses, long paragraphs.

Measured on the markdown cells of a notebook (or on a markdown file), with fenced code blocks, tables, HTML
comments and headings left out, and inline code kept as one word. "In the source:" lines are not prose: they
are counted apart (their references), so a cell's citations can live there without weighing on its sentences.

    python tools/prose_stats.py solutions/*.ipynb ERRORS.md     # one line per file, then the total
    python tools/prose_stats.py --long 40 solutions/06_fsdp.ipynb  # also list the sentences over 40 words
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

SOURCE_LINE = re.compile(r"^\s*(?:[*_]{1,2})?In the source(?:[*_]{1,2})?\s*[:：]", re.IGNORECASE)
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

    def add(self, other: "Stats") -> None:
        self.sentences += other.sentences
        self.paragraphs += other.paragraphs
        self.nested += other.nested
        self.inline_paths += other.inline_paths
        self.source_lines += other.source_lines
        self.long_sentences += other.long_sentences


def _prose_blocks(markdown: str) -> tuple[list[str], int]:
    """The paragraphs of `markdown` that are prose (list items are paragraphs of their own), and how many
    "In the source" lines it has."""
    markdown = re.sub(r"<!--.*?-->", "", markdown, flags=re.DOTALL)
    markdown = re.sub(r"^(```|~~~).*?^\1\s*$", "", markdown, flags=re.DOTALL | re.MULTILINE)
    blocks, current, source_lines = [], [], 0
    for line in markdown.split("\n"):
        stripped = line.strip()
        if SOURCE_LINE.match(stripped.lstrip("-* ")):
            source_lines += 1
            stripped = ""
        starts_item = re.match(r"^([-*+]|\d+[.)])\s+", stripped) is not None
        if not stripped or stripped.startswith("#") or stripped.startswith("|") or stripped.startswith(">") and False or starts_item:
            if current:
                blocks.append(" ".join(current))
                current = []
            if starts_item:
                current = [re.sub(r"^([-*+]|\d+[.)])\s+", "", stripped)]
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


def measure(markdown: str, long_limit: int = 40) -> Stats:
    """The figures of one markdown text."""
    stats = Stats()
    blocks, stats.source_lines = _prose_blocks(markdown)
    for block in blocks:
        stats.inline_paths += len(PACKAGE_PATH.findall(block))
        words = _words(block)
        if not words:
            continue
        stats.paragraphs.append(words)
        protected = re.sub(r"`[^`]*`", lambda m: m.group(0).replace(".", "\0").replace("?", "\1").replace("!", "\2"), block)
        for sentence in SENTENCE_END.split(protected):
            sentence = sentence.replace("\0", ".").replace("\1", "?").replace("\2", "!")
            n = _words(sentence)
            if not n:
                continue
            stats.sentences.append(n)
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
    total = Stats()
    for _, text in markdown_of(path):
        total.add(measure(text, long_limit))
    return total


def line(name: str, s: Stats) -> str:
    return (f"{name:32} words {s.words:6,}  sentences {len(s.sentences):5}  mean {s.mean:5.1f}  "
            f">40 {s.over(40):4} ({100 * s.share_over(40):4.1f} %)  nested {len(s.nested):3}  "
            f"paragraphs >120 {sum(1 for p in s.paragraphs if p > 120):3}  inline paths {s.inline_paths:4}  "
            f"source lines {s.source_lines:3}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
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
                cs = measure(text, args.long)
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
