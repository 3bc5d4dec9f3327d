"""Exercise checks, one module per lab (``course_lib.checks.lab00`` ...).

A check either prints one line starting with ✓ or raises :class:`CheckFailed`, which a notebook shows as
two short lines (what is wrong, and a hint at why) instead of a traceback.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, NoReturn


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


def launch_quietly(
    launch: Callable[..., list[Any]], fn: Callable[..., Any], *args: Any, world_size: int, timeout: float
) -> list[Any]:
    """`launch(fn, *args)` on `world_size` ranks for a check: no rank output in the cell, no warning that more
    ranks than cores share the machine (fine for a check), and `timeout` seconds at most (a wrong answer that
    hangs a collective ends in a ``LaunchError`` instead of a frozen cell)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return launch(fn, *args, world_size=world_size, show_ranks=[], timeout=timeout)


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"``: how a check reports an exception the learner's code raised."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"
