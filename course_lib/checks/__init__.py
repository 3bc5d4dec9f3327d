"""Exercise checks, one module per lab (``course_lib.checks.lab00`` ...).

A check either prints one line starting with ✓ or raises :class:`CheckFailed`, which a notebook shows as
two short lines (what is wrong, and a hint at why) instead of a traceback.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, NoReturn, TypeVar

Check = TypeVar("Check", bound=Callable[..., None])


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


def is_number(value: Any) -> bool:
    """Whether a learner's answer is a plain number: int, float or a NumPy scalar (``numbers.Real``), not a bool."""
    import numbers

    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def one_line(error: BaseException) -> str:
    """``"TypeName: first line of the message"``: how a check reports an exception the learner's code raised."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0] if text else ''}"


def same_gradients(name: str, loss: Any, inputs: dict[str, Any], reference: Callable[..., Any], args: tuple, why: str) -> None:
    """For a loss check, once `loss` has the right value: fail unless backpropagating it gives each of `inputs`
    (name -> the leaf tensor the learner's function got) the gradient that `reference(*args)` gives the same
    leading arguments; a loss cut from an input (``.detach()``, ``torch.tensor(loss.item(), requires_grad=True)``)
    has the right value and the wrong gradients."""
    import torch

    try:
        loss.backward()
    except RuntimeError as error:
        fail(f"{name}'s loss cannot be backpropagated: {one_line(error)}", "return the loss itself, built with torch operations")
    fresh = [x.detach().clone().requires_grad_() for x in args[: len(inputs)]]
    reference(*fresh, *args[len(inputs):]).backward()
    for (arg, given), want in zip(inputs.items(), fresh):
        if given.grad is None or not given.grad.abs().sum():
            fail(f"{name} has the right value, but no gradient reaches {arg}: the loss was cut from it "
                 "(.detach(), .item(), torch.tensor(...), .data)", why)
        if not torch.allclose(given.grad, want.grad, rtol=1e-4, atol=1e-6):
            fail(f"{name} has the right value, but its gradient with respect to {arg} is not the loss's (largest "
                 f"difference {float((given.grad - want.grad).abs().max()):.2e}): part of it was detached", why)


def _unwritten(error: BaseException | None) -> bool:
    """Whether `error` is the ``raise NotImplementedError()`` a lab leaves in an exercise (no message: a
    NotImplementedError with one, such as torch's "Could not run 'aten::...'", is a real answer's error)."""
    from course_lib.launcher.launch import LaunchError

    if isinstance(error, NotImplementedError):
        return not str(error).strip()
    if isinstance(error, LaunchError):  # the rank that failed first; the others failed because it did
        first = error.failures[0] if error.failures else None
        return first is not None and first.kind == "raised" and first.exc_type == "NotImplementedError" and not first.message.strip()
    return False


def raise_if_unwritten(error: BaseException) -> None:
    """Re-raise `error` if it is an unwritten exercise's stub: for a check that reports its answer's errors as
    text, so that ``@exercise`` can say "not written yet" rather than "raised NotImplementedError: "."""
    if _unwritten(error):
        raise error


def exercise(check: Check) -> Check:
    """Decorate a check whose first argument is the learner's answer (a function, a class or a value): run
    before the exercise is written (its ``raise NotImplementedError()`` still in place), the check fails
    with one line that says so, whether the stub raised in the check's own process, on a launched rank, or
    inside the check's own ``except`` (a ``CheckFailed`` caused by it), instead of a traceback."""

    @functools.wraps(check)
    def checked(answer: Any, *args: Any, **kwargs: Any) -> None:
        name = getattr(answer, "__name__", "your answer")
        try:
            return check(answer, *args, **kwargs)
        except CheckFailed as failure:
            if not _unwritten(failure.__cause__ or failure.__context__):
                raise
        except Exception as error:  # noqa: BLE001  (re-raised unless it is the stub's)
            if not _unwritten(error):
                raise
        fail(f"{name} is not written yet", "replace `raise NotImplementedError()` with your code, then run this cell again")

    return checked  # type: ignore[return-value]
