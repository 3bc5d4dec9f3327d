"""Exercise checks, one module per lab (``course_lib.checks.lab00`` ...).

A check either prints one line starting with ✓ or raises :class:`CheckFailed`, which a notebook shows as
two short lines (what is wrong, and a hint at why) instead of a traceback.
"""
from __future__ import annotations

from typing import NoReturn


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; `hint` says where to look."""

    def __init__(self, problem: str, hint: str = "") -> None:
        self.problem = problem
        self.hint = hint
        super().__init__(problem + (f"\nhint: {hint}" if hint else ""))

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        lines = [f"✗ {self.problem}"]
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return lines


def fail(problem: str, hint: str = "") -> NoReturn:
    raise CheckFailed(problem, hint)


def passed(message: str) -> None:
    print(f"✓ {message}")
