"""Exercise checks, one module per lab (``course_lib.checks.lab00`` ...).

A check either prints one line starting with ✓ or raises :class:`CheckFailed`, which a notebook shows as
two short lines (what is wrong, and a hint at why) instead of a traceback.
"""
from __future__ import annotations

import contextlib
import functools
import sys
import warnings
from typing import Any, Callable, Mapping, NoReturn, TypeVar

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


def same_start(tensors: Mapping[str, Any]) -> tuple[str, str] | None:
    """Two of `tensors` (name -> a model's initial parameter) that hold the same values though they are different
    parameters of the same shape, or None. Random initialization gives every layer its own draw; seeding before
    each module's ``reset_parameters()`` gives every layer of a shape the same weights, which trains like fewer
    layers and which a loss compared with a copy started from the same weights does not show. Constant tensors
    (a LayerNorm's ones and zeros) are left out: they are meant to be equal."""
    import torch

    seen: dict[tuple[Any, ...], list[tuple[str, Any]]] = {}
    for name, tensor in tensors.items():
        if tensor.numel() < 2 or bool((tensor == tensor.flatten()[0]).all()):
            continue
        for other, earlier in seen.setdefault((tuple(tensor.shape), tensor.dtype), []):
            if torch.equal(earlier, tensor):
                return other, name
        seen[(tuple(tensor.shape), tensor.dtype)].append((name, tensor))
    return None


class InputChanged(Exception):
    """Raised (on a rank, or here) when a learner's function changed an argument it was handed."""


class ModuleChanged(InputChanged):
    """Raised when a learner's function changed a module it was handed: its parameters or buffers changed, were cast
    or moved."""


class KeptState(InputChanged):
    """Raised when a call to a learner's function changed what an earlier call of it had returned: the answer keeps
    state between calls (a module-level dict that each call updates and every result shares)."""


def _snapshot(value: Any, results: bool = False, depth: int = 0) -> Any:
    """A copy of what a function may not change in `value`: tensors (values, dtype, device), KJTs, lists,
    tuples, dicts and dataclasses of them, and modules (each parameter's and buffer's values, dtype and device).
    Optimizers and other objects are left out (an exercise may have to step an optimizer; a module it must
    change, by training or wrapping it, is named in ``may_change``).

    With `results`, for what a function returned: modules and optimizers are left out (the check trains and
    reads them), and other objects are copied attribute by attribute (a sharder's ``fused_params``, its codecs),
    a few levels deep."""
    import dataclasses
    import enum

    import torch

    if depth > (6 if results else 12):  # a ShardingPlan's shard offsets sit 8 levels down; results stay shallow
        return ("unchecked",)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.detach().clone(), value.dtype, value.device, tuple(value.shape))
    if type(value).__name__ == "KeyedJaggedTensor":
        return ("kjt", list(value.keys()), _snapshot(value.values()), _snapshot(value.lengths()), _snapshot(value.weights_or_none()))
    if isinstance(value, torch.nn.Module):
        if results:
            return ("unchecked",)
        tensors = {f"parameter {name}": _snapshot(t) for name, t in value.named_parameters()}
        tensors.update({f"buffer {name}": _snapshot(t) for name, t in value.named_buffers()})
        return ("module", type(value), tensors)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [_snapshot(item, results, depth + 1) for item in value])
    if isinstance(value, dict):
        return ("dict", {key: _snapshot(item, results, depth + 1) for key, item in value.items()})
    if dataclasses.is_dataclass(value) and not isinstance(value, type):  # field by field (a config's init_fn
        return ("dataclass", {f.name: _snapshot(getattr(value, f.name), results, depth + 1)  # is left out)
                              for f in dataclasses.fields(value)})
    if value is None or isinstance(value, (str, bytes, int, float, complex, bool, enum.Enum, torch.device, torch.dtype)):
        return ("value", value)
    if (results and not isinstance(value, (type, torch.optim.Optimizer)) and not callable(value)
            and isinstance(getattr(value, "__dict__", None), dict)):
        return ("object", {key: _snapshot(item, results, depth + 1) for key, item in vars(value).items()})
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
    if kind == "module":
        return _module_change(before, value) is None
    if kind in ("list", "tuple"):
        return (isinstance(value, (list, tuple)) and len(value) == len(before[1])
                and all(_same(b, v) for b, v in zip(before[1], value)))
    if kind == "dict":
        return (isinstance(value, dict) and value.keys() == before[1].keys()
                and all(_same(before[1][key], value[key]) for key in value))
    if kind == "dataclass":
        return all(_same(field, getattr(value, name, None)) for name, field in before[1].items())
    if kind == "object":
        now = getattr(value, "__dict__", None)
        return (isinstance(now, dict) and now.keys() == before[1].keys()
                and all(_same(before[1][key], now[key]) for key in now))
    return type(value) is type(before[1]) and value == before[1]


def _module_change(before: Any, module: Any) -> str | None:
    """What changed in a module since its snapshot, in words (None: nothing)."""
    import torch

    _, kind, tensors = before
    if not isinstance(module, torch.nn.Module) or type(module) is not kind:
        return f"it is now a {type(module).__name__}"
    now = {f"parameter {name}": t for name, t in module.named_parameters()}
    now.update({f"buffer {name}": t for name, t in module.named_buffers()})
    for name, snapshot in tensors.items():
        if name not in now:
            return f"its {name} is gone"
        _, data, dtype, device, shape = snapshot
        tensor = now[name]
        if tensor.device != device:
            return f"its {name} moved from {device} to {tensor.device}"
        if tensor.dtype != dtype:
            return f"its {name} was cast from {dtype} to {tensor.dtype}"
        if tuple(tensor.shape) != shape:
            return f"its {name} changed shape from {shape} to {tuple(tensor.shape)}"
        if not torch.equal(tensor.detach(), data):
            return f"the values of its {name} changed"
    added = sorted(set(now) - set(tensors))
    return f"it gained {added[0]}" if added else None


# What each of the last learners' functions returned, and a snapshot of it taken then (see call_unchanged)
_RESULTS: dict[int, tuple[Callable[..., Any], list[tuple[int, Any, Any]]]] = {}
_RESULTS_KEPT = 32  # results per function, and functions


def call_unchanged(name: str, fn: Callable[..., Any], *args: Any, may_change: tuple[int | str, ...] = (),
                   **kwargs: Any) -> Any:
    """Call a learner's ``fn(*args, **kwargs)`` and return its result, raising :class:`InputChanged` when the
    call changed an argument it was handed: a tensor changed in place (``ids //= block``, ``dist.all_reduce(x)``
    on the caller's ``x``, ``.sigmoid_()``), moved or cast (``.data = ...``), a list sorted or emptied, a dict
    popped, a module's parameters changed, cast or moved (``model.half()``, ``model.to("meta")``). The rule of
    every check: an answer works on copies of what it is given. `may_change` names the arguments (0-based
    positions, or keywords) the exercise asks the function to change, such as a model it must train.

    It also raises :class:`KeptState` when the call changed what an earlier call of the same `fn` returned: an
    answer that keeps state between calls (a module-level dict it updates, and returns or builds into each
    result) is right for each call alone, and every object it built before changes with the last call."""
    before = [None if position in may_change else _snapshot(arg) for position, arg in enumerate(args)]
    before_kwargs = {key: _snapshot(value) for key, value in kwargs.items() if key not in may_change}
    result = fn(*args, **kwargs)
    changed = [(f"{position + 1}", snapshot, arg) for position, (snapshot, arg) in enumerate(zip(before, args))
               if snapshot is not None]
    changed += [(repr(key), snapshot, kwargs[key]) for key, snapshot in before_kwargs.items()]
    for which, snapshot, arg in changed:
        if _same(snapshot, arg):
            continue
        said = f"{name} changed its argument {which} ({_described(arg)}) in place"
        if snapshot[0] == "module":
            raise ModuleChanged(f"{said}: {_module_change(snapshot, arg)}")
        raise InputChanged(said)
    _check_earlier_results(name, fn, result)
    return result


def _check_earlier_results(name: str, fn: Callable[..., Any], result: Any) -> None:
    """Raise :class:`KeptState` if what an earlier call of `fn` returned has changed since; then remember `result`."""
    key = id(fn)
    if key not in _RESULTS or _RESULTS[key][0] is not fn:
        _RESULTS.pop(key, None)
        while len(_RESULTS) >= _RESULTS_KEPT:
            _RESULTS.pop(next(iter(_RESULTS)))
        _RESULTS[key] = (fn, [])
    earlier = _RESULTS[key][1]
    for number, returned, snapshot in earlier:
        if not _same(snapshot, returned):
            raise KeptState(
                f"calling {name} again changed {_described(returned)} that an earlier call of it had returned (call "
                f"{number}): it keeps state between calls (a module-level dict or list that each call updates and "
                "puts into what it returns), so everything it built before changes with the last call")
    number = (earlier[-1][0] + 1) if earlier else 1
    earlier.append((number, result, _snapshot(result, results=True)))
    del earlier[:-_RESULTS_KEPT]


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


MODULE_CHANGED_HINT = (
    "the caller still needs the model it handed over, as it was: read its parameters (p.numel(), p.element_size(), "
    "p.dtype), do not cast, move or change them (model.half(), model.to(...), p.data = ...); work on a "
    "copy.deepcopy(model) if you must"
)

KEPT_STATE_HINT = (
    "build what you return afresh in each call, from the arguments of that call: a new dict, list or object each "
    "time, not a module-level one that every call updates"
)


def checked_call(name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """:func:`call_unchanged` for a check running in this process: an answer that changed its inputs fails."""
    try:
        return call_unchanged(name, fn, *args, **kwargs)
    except KeptState as kept:
        fail(str(kept), KEPT_STATE_HINT)
    except ModuleChanged as changed:
        fail(str(changed), MODULE_CHANGED_HINT)
    except InputChanged as changed:
        fail(str(changed), INPUT_CHANGED_HINT)


def builds_on(answer: Any, name: str) -> Callable[..., Any] | None:
    """The earlier exercise's answer `name` that a later `answer` calls (``choose_mesh`` calling the learner's
    ``bytes_per_rank``): the function bound to `name` in the answer's globals (a notebook's namespace) when its
    code, or a function nested in it, reads that global; None when it does not."""
    code, seen = getattr(answer, "__code__", None), []
    while code is not None or seen:
        if code is not None:
            if name in code.co_names:
                found = getattr(answer, "__globals__", {}).get(name)
                return found if callable(found) and found is not answer else None
            seen.extend(const for const in code.co_consts if hasattr(const, "co_names"))
        code = seen.pop() if seen else None
    return None


def judged_again(earlier: str, judge: Callable[..., None], *args: Any, by: str = "your answer") -> None:
    """Re-apply an earlier exercise's judgement, `judge(*args)` (its check's core, failing as that check fails),
    to what a later answer builds on or builds: a later check that accepts what an earlier one refuses lets the
    earlier mistake through. A failure keeps the earlier check's words and says whose they are."""
    try:
        judge(*args)
    except CheckFailed as failure:
        raise CheckFailed(f"{failure.problem} ({by} builds on it, and {earlier}'s check refuses it)", failure.hint,
                          failure.notes) from failure.__cause__


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


def whose(*answers: Any) -> str:
    """"your" when every answer is the learner's, "reference" when the course's reference stands in for one.

    For the labels of the tables and lines that a lab fills with an exercise's answer after its check:
    ``f"{whose(bytes_per_rank)} prediction"`` reads "your prediction" or "reference prediction".
    """
    return "reference" if any(_is_reference(answer) for answer in answers) else "your"


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


def _passed_before(before: dict | None) -> tuple[str, ...]:
    if before and before.get("last_passed") and before.get("verdict") == "passed":
        when = str(before["last_passed"]).replace("T", " ")[:16]
        return (f"(this exercise passed at {when}: what changed since?)",)
    return ()


def _keep_path_open(lab: str, check: Callable[..., Any], namespace: dict[str, Any], name: str,
                    unwritten: bool) -> tuple[str, ...]:
    """After a check that did not pass, from a notebook: record the verdict, put the reference answer in place,
    and return the lines that say so (with when the exercise last passed, for a written answer that fails now)."""
    from course_lib import progress

    before = progress.record(lab, check.__name__, "unwritten" if unwritten else "failed", answer=name)
    return (() if unwritten else _passed_before(before)) + (_use_reference(lab, check, namespace, unwritten),)


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
            notes = failure.notes
            if namespace is not None and lab:
                notes += _keep_path_open(lab, check, namespace, name, unwritten)
            raise CheckFailed(problem, hint, notes) from (None if unwritten else failure.__cause__)
        except Exception as error:  # noqa: BLE001  (re-raised unless it is the stub's)
            unwritten = _unwritten(error)
            notes = _keep_path_open(lab, check, namespace, name, unwritten) if namespace is not None and lab else ()
            if not unwritten:
                for note in notes:
                    error.add_note(note)
                raise
            raise CheckFailed(f"{name} is not written yet", UNWRITTEN_HINT, notes) from None
        if namespace is not None and lab:
            from course_lib import progress

            progress.record(lab, check.__name__, "passed", answer=name)
        return result

    return checked  # type: ignore[return-value]
