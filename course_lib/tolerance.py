"""Stored outputs that hold on another CPU: figures compared within a tolerance the cell declares.

A loss, an AUC or a quantization error comes out of floating-point sums whose order depends on the CPU's
vector width (ATen's AVX2 / AVX-512 kernels, fbgemm's and MKL's code paths) and on the number of threads.
The same notebook then prints ``0.7983`` on one laptop and ``0.7982`` on another. A cell whose outputs hold
such figures says so in a comment that the learner reads too::

    # tolerance: ±0.002 (AUCs move in the 4th decimal with the CPU's floating-point kernels)

and the course's nbval hook (the repository's ``conftest.py``) compares that cell's outputs with
`compare`: every decimal figure (a number written with a point or an exponent) may move by the declared
amount; everything else must match exactly: the words and the layout around the figures, every whole
number (counts, bytes, ranks, steps), and how many decimals each figure is written with. ``±X`` is an
absolute tolerance, ``±X%`` a relative one; both may be given (``±0.001 ±2%``: the larger applies).
Figures of different kinds in one output get their own amounts from the text before them on their line::

    # tolerance: ±0.002; ±10% after "logit diff"; ±0.01 after "scores" (why)

Here a figure that follows ``logit diff`` on its line (in an HTML table: in its row) may move 10%, one after ``scores`` 0.01 (the last
rule whose words come before the figure wins) and every other decimal figure 0.002. Without a leading
amount, the figures no rule names are compared exactly. Cells without the comment are compared exactly,
as nbval does.

    tolerance = declared_tolerance(cell_source)      # None when the cell declares none
    problems = compare(stored_text, new_text, tolerance)   # [] when they agree
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["Tolerance", "Declared", "declared_tolerance", "figures", "compare"]

# A number standing on its own: not glued to a word ("fp32", "t_user2") or to another number's point.
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?!\w|\.\d)")
_MARKER = re.compile(r"^\s*#\s*tolerance:\s*(?P<spec>.*)$", re.MULTILINE)
_AMOUNT = re.compile(r"±\s*(?P<value>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(?P<percent>%)?")
_RULE = re.compile(r'^(?P<amounts>(?:\s*±[^±"]+)+?)\s*(?:after\s+"(?P<label>[^"]+)")?\s*$')


@dataclass(frozen=True)
class Tolerance:
    """How far a decimal figure may move: ``absolute``, or ``relative`` (a fraction of the stored figure)."""

    absolute: float = 0.0
    relative: float = 0.0

    def allows(self, stored: float, new: float) -> bool:
        if math.isnan(stored) or math.isnan(new):
            return math.isnan(stored) and math.isnan(new)
        return abs(new - stored) <= max(self.absolute, self.relative * abs(stored)) + 1e-12

    def __str__(self) -> str:
        parts = ([f"±{self.absolute:g}"] if self.absolute else []) + ([f"±{self.relative:.0%}"] if self.relative else [])
        return " ".join(parts) or "±0"


@dataclass(frozen=True)
class Declared:
    """What a cell declares: a `default` tolerance for every decimal figure (None: exact) and `rules`, each
    ``(words, tolerance)`` for the figures that follow those words on their line."""

    default: Tolerance | None = None
    rules: tuple[tuple[str, Tolerance], ...] = ()

    def for_figure(self, before_on_line: str) -> Tolerance:
        """The tolerance of a figure, given the text before it on its line (the last matching rule wins)."""
        chosen = self.default or Tolerance()
        for words, tolerance in self.rules:
            if words in before_on_line:
                chosen = tolerance
        return chosen

    def __str__(self) -> str:
        parts = [str(self.default)] if self.default else []
        return "; ".join(parts + [f'{tolerance} after "{words}"' for words, tolerance in self.rules])


def _unreadable(comment: str, part: str) -> ValueError:
    return ValueError(f"'# tolerance: {comment}': cannot read {part.strip()!r}; write ±0.002, ±5% or ±0.01 after \"words\"")


def _amounts(text: str, comment: str) -> Tolerance:
    absolute = relative = 0.0
    found = list(_AMOUNT.finditer(text))
    if not found or _AMOUNT.sub("", text).strip():
        raise _unreadable(comment, text)
    for amount in found:
        value = float(amount.group("value"))
        if amount.group("percent"):
            relative = max(relative, value / 100)
        else:
            absolute = max(absolute, value)
    return Tolerance(absolute, relative)


def declared_tolerance(source: str) -> Declared | None:
    """What a cell's ``# tolerance: ±X [±Y%]; ±Z after "words" (why)`` comment declares, None without one.

    A comment that cannot be read raises ValueError: a typo must not silently compare exactly or loosely.
    """
    match = _MARKER.search(source)
    if match is None:
        return None
    comment = match.group("spec")
    spec = re.sub(r"\s*\([^()]*\)\s*$", "", comment)  # the reason in parentheses is for the reader
    default, rules = None, []
    for part in filter(str.strip, spec.split(";")):
        rule = _RULE.match(part)
        if rule is None:
            raise _unreadable(comment, part)
        tolerance = _amounts(rule.group("amounts"), comment)
        if rule.group("label"):
            rules.append((rule.group("label"), tolerance))
        elif default is None and not rules:
            default = tolerance
        else:
            raise ValueError(f"'# tolerance: {comment}': only the first amount may stand without 'after \"words\"'")
    if default is None and not rules:
        raise ValueError(f"'# tolerance: {comment}' names no amount; write it as ±0.002 or ±5%")
    return Declared(default, tuple(rules))


def _is_decimal(token: str) -> bool:
    return "." in token or "e" in token.lower()


def _decimals(token: str) -> str:
    """How a decimal figure is written (digits after the point, exponent or not): part of the exact text."""
    mantissa, _, exponent = token.lower().partition("e")
    return f"{len(mantissa.partition('.')[2])}{'e' if exponent else ''}"


def figures(text: str) -> tuple[str, list[str], list[str]]:
    """Split `text` into its skeleton (the text with each decimal figure replaced by a placeholder that keeps
    its number of decimals, runs of spaces made one), its decimal figures in order, and for each figure the
    text before it on its line."""
    found: list[str] = []
    before: list[str] = []

    def placeholder(match: re.Match) -> str:
        token = match.group(0)
        if not _is_decimal(token):
            return token  # whole numbers stay in the text: compared exactly
        found.append(token)
        before.append(text[_line_start(text, match.start()):match.start()])
        return f"<figure:{_decimals(token)}>"

    skeleton = _NUMBER.sub(placeholder, text)
    return re.sub(r"[ \t]+", " ", skeleton), found, before


def _line_start(text: str, position: int) -> int:
    """Where the line of `position` starts; in an HTML table (a DataFrame's text/html), where its row starts."""
    row = text.rfind("<tr", 0, position)
    if row > text.rfind("</tr>", 0, position):
        return row
    return text.rfind("\n", 0, position) + 1


def compare(stored: str, new: str, tolerance: Tolerance | Declared) -> list[str]:
    """What differs between a stored output and a new one beyond `tolerance`, in words ([] when they agree).

    The text around the figures, whole numbers and each figure's number of decimals must be equal; a
    difference in the width of the spaces between columns is not a difference (a table re-aligns when a
    figure gains a digit). Each decimal figure may move by its tolerance (`tolerance`, or what a `Declared`
    gives the text before it on its line).
    """
    if stored == new:
        return []
    declared = tolerance if isinstance(tolerance, Declared) else Declared(tolerance)
    stored_skeleton, stored_figures, contexts = figures(stored)
    new_skeleton, new_figures, _ = figures(new)
    if stored_skeleton != new_skeleton:
        return [_first_text_difference(stored_skeleton, new_skeleton)]
    problems = []
    for index, (before, after, context) in enumerate(zip(stored_figures, new_figures, contexts), start=1):
        allowed = declared.for_figure(context)
        if not allowed.allows(float(before), float(after)):
            problems.append(f"figure {index} of {len(stored_figures)} ({context.strip()[-40:]!r} ...): stored "
                            f"{before}, now {after} (moved {abs(float(after) - float(before)):.3g}, more than "
                            f"its {allowed})")
    return problems


def _first_text_difference(stored: str, new: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(stored, new)) if a != b), min(len(stored), len(new)))
    start = max(0, at - 30)
    return (f"the text around the figures differs (a tolerance covers decimal figures only): "
            f"stored ...{stored[start:at + 30]!r}... now ...{new[start:at + 30]!r}...")
