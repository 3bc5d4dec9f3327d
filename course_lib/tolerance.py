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
Cells without the comment are compared exactly, as nbval does.

    tolerance = declared_tolerance(cell_source)      # None when the cell declares none
    problems = compare(stored_text, new_text, tolerance)   # [] when they agree
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

__all__ = ["Tolerance", "declared_tolerance", "figures", "compare"]

# A number standing on its own: not glued to a word ("fp32", "t_user2") or to another number's point.
_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?!\w|\.\d)")
_MARKER = re.compile(r"^\s*#\s*tolerance:\s*(?P<spec>.*)$", re.MULTILINE)
_AMOUNT = re.compile(r"±\s*(?P<value>\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*(?P<percent>%)?")


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


def declared_tolerance(source: str) -> Tolerance | None:
    """The tolerance a cell's ``# tolerance: ±X [±Y%] (why)`` comment declares, or None without one.

    A comment that names no amount raises ValueError: a typo must not silently compare exactly or loosely.
    """
    match = _MARKER.search(source)
    if match is None:
        return None
    absolute = relative = 0.0
    spec = match.group("spec").split("(")[0]  # the reason in parentheses is for the reader
    amounts = list(_AMOUNT.finditer(spec))
    if not amounts:
        raise ValueError(f"'# tolerance: {match.group('spec')}' names no amount; write it as ±0.002 or ±5%")
    for amount in amounts:
        value = float(amount.group("value"))
        if amount.group("percent"):
            relative = max(relative, value / 100)
        else:
            absolute = max(absolute, value)
    return Tolerance(absolute, relative)


def _is_decimal(token: str) -> bool:
    return "." in token or "e" in token.lower()


def _decimals(token: str) -> str:
    """How a decimal figure is written (digits after the point, exponent or not): part of the exact text."""
    mantissa, _, exponent = token.lower().partition("e")
    return f"{len(mantissa.partition('.')[2])}{'e' if exponent else ''}"


def figures(text: str) -> tuple[str, list[str]]:
    """Split `text` into its skeleton (the text with each decimal figure replaced by a placeholder that keeps
    its number of decimals, runs of spaces made one) and the decimal figures in order."""
    found: list[str] = []

    def placeholder(match: re.Match) -> str:
        token = match.group(0)
        if not _is_decimal(token):
            return token  # whole numbers stay in the text: compared exactly
        found.append(token)
        return f"<figure:{_decimals(token)}>"

    skeleton = _NUMBER.sub(placeholder, text)
    return re.sub(r"[ \t]+", " ", skeleton), found


def compare(stored: str, new: str, tolerance: Tolerance) -> list[str]:
    """What differs between a stored output and a new one beyond `tolerance`, in words ([] when they agree).

    The text around the figures, whole numbers and each figure's number of decimals must be equal; a
    difference in the width of the spaces between columns is not a difference (a table re-aligns when a
    figure gains a digit). Each decimal figure may move by `tolerance`.
    """
    if stored == new:
        return []
    stored_skeleton, stored_figures = figures(stored)
    new_skeleton, new_figures = figures(new)
    if stored_skeleton != new_skeleton:
        return [_first_text_difference(stored_skeleton, new_skeleton)]
    problems = []
    for index, (before, after) in enumerate(zip(stored_figures, new_figures), start=1):
        if not tolerance.allows(float(before), float(after)):
            problems.append(f"figure {index} of {len(stored_figures)}: stored {before}, now {after} "
                            f"(moved {abs(float(after) - float(before)):.3g}, more than the cell's {tolerance})")
    return problems


def _first_text_difference(stored: str, new: str) -> str:
    at = next((i for i, (a, b) in enumerate(zip(stored, new)) if a != b), min(len(stored), len(new)))
    start = max(0, at - 30)
    return (f"the text around the figures differs (a tolerance covers decimal figures only): "
            f"stored ...{stored[start:at + 30]!r}... now ...{new[start:at + 30]!r}...")
