"""Exercise checks, one module per lab (``course_lib.checks.lab00`` ...).

A check either prints one line starting with ✓ or raises :class:`CheckFailed`, which a notebook shows as
two short lines (what is wrong, and a hint at why) instead of a traceback.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from typing import Any, Callable, NoReturn, TypeVar

Check = TypeVar("Check", bound=Callable[..., None])


class CheckFailed(AssertionError):
    """An exercise's answer is wrong; `hint` says where to look."""

    def __init__(self, problem: str, hint: str = "", notes: tuple[str, ...] = ()) -> None:
        self.problem = problem
        self.hint = hint
        self.notes = tuple(notes)  # what the course did about it (the reference answer now in use, ...)
        super().__init__(problem + (f"\nhint: {hint}" if hint else "") + "".join(f"\n{note}" for note in self.notes))

    def _render_traceback_(self) -> list[str]:  # IPython shows this instead of a traceback
        lines = [f"✗ {self.problem}"]
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        lines += [f"  {note}" for note in self.notes]
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


class InputChanged(Exception):
    """Raised (on a rank, or here) when a learner's function changed an argument it was handed."""


def _snapshot(value: Any) -> Any:
    """A copy of what a function may not change in `value`: tensors (values, dtype, device), KJTs, lists,
    tuples, dicts and dataclasses of them. Modules, optimizers and other objects are left out (an exercise may
    have to change those: wrap a model, step an optimizer)."""
    import dataclasses

    import torch

    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone(), value.dtype, value.device, tuple(value.shape))
    if type(value).__name__ == "KeyedJaggedTensor":
        return ("kjt", list(value.keys()), _snapshot(value.values()), _snapshot(value.lengths()), _snapshot(value.weights_or_none()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_snapshot(item) for item in value])
    if isinstance(value, dict):
        return ("dict", {key: _snapshot(item) for key, item in value.items()})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # field by field (a config's init_fn
        return ("dataclass", {f.name: _snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)})  # is left out)
    if value is None or isinstance(value, (str, bytes, int, float, complex, bool)):
        return ("value", value)
    return ("unchecked",)


def _same(before: Any, value: Any) -> bool:
    import torch

    kind = before[0]
    if kind == "unchecked":
        return True
    if kind == "tensor":
        _, data, dtype, device, shape = before
        return (isinstance(value, torch.Tensor) and value.dtype == dtype and value.device == device
                and tuple(value.shape) == shape and torch.equal(value.detach(), data))
    if kind == "kjt":
        _, keys, values, lengths, weights = before
        return (list(value.keys()) == keys and _same(values, value.values()) and _same(lengths, value.lengths())
                and _same(weights, value.weights_or_none()))
    if kind in ("list", "tuple"):
        return (isinstance(value, (list, tuple)) and len(value) == len(before[1])
                and all(_same(b, v) for b, v in zip(before[1], value)))
    if kind == "dict":
        return (isinstance(value, dict) and value.keys() == before[1].keys()
                and all(_same(before[1][key], value[key]) for key in value))
    if kind == "dataclass":
        return all(_same(field, getattr(value, name, None)) for name, field in before[1].items())
    return value == before[1]


def call_unchanged(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call a learner's ``fn(*args, **kwargs)`` and return its result, raising :class:`InputChanged` when the
    call changed an argument it was handed: a tensor changed in place (``ids //= block``, ``dist.all_reduce(x)``
    on the caller's ``x``, ``.sigmoid_()``), moved or cast (``.data = ...``), a list sorted or emptied, a dict
    popped. The rule of every check: an answer works on copies of what it is given."""
    before = [_snapshot(arg) for arg in args]
    before_kwargs = {key: _snapshot(value) for key, value in kwargs.items()}
    result = fn(*args, **kwargs)
    for position, (snapshot, arg) in enumerate(zip(before, args)):
        if not _same(snapshot, arg):
            raise InputChanged(f"{name} changed its argument {position + 1} ({_described(arg)}) in place")
    for key, snapshot in before_kwargs.items():
        if not _same(snapshot, kwargs[key]):
            raise InputChanged(f"{name} changed its argument {key!r} ({_described(kwargs[key])}) in place")
    return result


def _described(value: Any) -> str:
    import torch

    if isinstance(value, torch.Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    name = type(value).__name__
    return f"{'an' if name[0] in 'AEIOUaeiou' else 'a'} {name}"


INPUT_CHANGED_HINT = (
    "the caller still needs what it handed over: work on a copy (x.clone(), list(xs), dict(d)) or out of place "
    "(x // k, not x //= k; torch.sigmoid(x), not x.sigmoid_()); a collective that works in place, such as "
    "dist.all_reduce, needs a copy of the caller's tensor"
)


def checked_call(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`call_unchanged` for a check running in this process: an answer that changed its inputs fails."""
    try:
        return call_unchanged(name, fn, *args, **kwargs)
    except InputChanged as changed:
        fail(str(changed), INPUT_CHANGED_HINT)


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


UNWRITTEN_HINT = "replace `raise NotImplementedError()` with your code, then run this cell again"


def _notebook_namespace(frame: Any) -> dict[str, Any] | None:
    """The notebook's namespace when `frame` is a cell of a live IPython kernel, else None (a test, a script)."""
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython is a course dependency
        return None
    shell = get_ipython()
    if shell is None or frame is None or frame.f_globals is not shell.user_ns:
        return None
    return shell.user_ns


def _lab_of(check: Callable[..., Any]) -> str:
    """"08" for a check of ``course_lib.checks.lab08``; "" for one defined elsewhere."""
    module = check.__module__.rsplit(".", 1)[-1]
    return module[3:] if module.startswith("lab") and module[3:].isdigit() else ""


REFERENCE_MARK = "__course_reference__"


def _is_reference(value: Any) -> bool:
    return getattr(value, REFERENCE_MARK, False) is True


def _use_reference(lab: str, check: Callable[..., Any], namespace: dict[str, Any], unwritten: bool) -> str:
    """Put the course's reference answer of `check` in the notebook's `namespace`; the one line that says so."""
    from course_lib import reference

    try:
        cell = reference.use_reference(lab, check.__name__, namespace)
    except reference.NoReference as missing:
        return f"↪ no reference answer here to use instead ({missing}): the cells below need yours"
    except Exception as error:  # noqa: BLE001  (the cells above it did not run, or were changed)
        return (f"↪ the course's reference answer could not stand in ({one_line(error)}): run the cells above "
                "this exercise, then this check again")
    for name in cell.answers:  # marked, so that a check handed the reference does not count it as the learner's
        with contextlib.suppress(AttributeError, TypeError, KeyError):
            setattr(namespace[name], REFERENCE_MARK, True)
    answers = " and ".join(f"`{name}`" for name in cell.answers)
    if unwritten:
        return (f"↪ meanwhile the cells below use the course's reference {answers}; "
                "yours takes over once you write it and run its cell again")
    return (f"↪ until yours passes, the cells below use the course's reference {answers}; "
            "run your cell again to use yours")


def _record(lab: str, check: Callable[..., Any], verdict: str, name: str) -> dict | None:
    from course_lib import progress

    return progress.record(lab, check.__name__, verdict, answer=name)


def _passed_before(before: dict | None) -> tuple[str, ...]:
    if before and before.get("last_passed") and before.get("verdict") == "passed":
        when = str(before["last_passed"]).replace("T", " ")[:16]
        return (f"(this exercise passed at {when}: what changed since?)",)
    return ()


def exercise(check: Check) -> Check:
    """Decorate a check whose first argument is the learner's answer (a function, a class or a value).

    Run before the exercise is written (its ``raise NotImplementedError()`` still in place), the check fails
    with one line that says so, whether the stub raised in the check's own process, on a launched rank, or
    inside the check's own ``except`` (a ``CheckFailed`` caused by it), instead of a traceback.

    Called from a notebook, it also keeps the learner's path open: the verdict is recorded for ``make
    progress`` (:mod:`course_lib.progress`), and an answer that does not pass is replaced, for the cells below,
    by the course's reference answer (:mod:`course_lib.reference`), in one line that says so. The cell still
    fails, so "Run All" still stops at the exercise.
    """

    @functools.wraps(check)
    def checked(answer: Any, *args: Any, **kwargs: Any) -> None:
        name = getattr(answer, "__name__", "your answer")
        namespace = _notebook_namespace(sys._getframe(1))
        lab = _lab_of(check)
        if namespace is not None and any(_is_reference(value) for value in (answer, *args, *kwargs.values())):
            fail(f"{name} is the course's reference answer, not yours: your exercise cell has not run since "
                 "the last check put the reference in its place",
                 "run your exercise cell (it defines yours), then this check")
        try:
            result = check(answer, *args, **kwargs)
        except CheckFailed as failure:
            unwritten = _unwritten(failure.__cause__ or failure.__context__)
            problem, hint = (f"{name} is not written yet", UNWRITTEN_HINT) if unwritten else (failure.problem, failure.hint)
            notes: tuple[str, ...] = failure.notes
            if namespace is not None and lab:
                before = _record(lab, check, "unwritten" if unwritten else "failed", name)
                notes += () if unwritten else _passed_before(before)
                notes += (_use_reference(lab, check, namespace, unwritten),)
            if unwritten:
                raise CheckFailed(problem, hint, notes) from None
            raise CheckFailed(problem, hint, notes) from failure.__cause__
        except Exception as error:  # noqa: BLE001  (re-raised unless it is the stub's)
            unwritten = _unwritten(error)
            if namespace is not None and lab:
                _record(lab, check, "unwritten" if unwritten else "failed", name)
                note = _use_reference(lab, check, namespace, unwritten)
                if not unwritten:
                    error.add_note(note)
                    raise
                raise CheckFailed(f"{name} is not written yet", UNWRITTEN_HINT, (note,)) from None
            if not unwritten:
                raise
            fail(f"{name} is not written yet", UNWRITTEN_HINT)
        if namespace is not None and lab:
            _record(lab, check, "passed", name)
        return result

    return checked  # type: ignore[return-value]
