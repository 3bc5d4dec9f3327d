"""Checks for 08_checkpointing: an app state to checkpoint, the save call, a reload into a new world size.

Each check runs the learner's code on several ranks with the lab's DLRM (table-wise, fused Adagrad
tables + Adam for the dense part), in a temporary folder that is removed afterwards, and compares whole
tensors (``course_lib.checkpoint.full_tensors``): weights, the fused optimizer's state, Adam's state.
"""
from __future__ import annotations

import hashlib
import math
import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from course_lib import data
from course_lib.checks import InputChanged, call_unchanged, exercise, fail, one_line, passed, raise_if_unwritten

# A small world for the checks: the lab's tables, few rows (fast to make and to train on).
_CHECK_CONFIG = data.ClickLogConfig(num_train=4_000, num_test=500, seed=3)
_BATCH = 32
_SAVED_AT = 3  # the checks save after this many steps
_ROWS = 240  # the fixed batch whose predictions are compared (divisible by 1, 2, 3, 4 ranks)
_TIMEOUT = 60.0  # seconds a check's launch may take (a few, normally): past it, a rank waits for peers that never come
# A second checkpoint, of other table sizes, taken at another step: an answer that builds the lab's model
# (log.config) instead of the config it is handed, or reads a checkpoint other than the path it is handed, is
# right for the first checkpoint only.
_OTHER_CONFIG = data.ClickLogConfig(num_users=300, num_items=120, num_categories=12, num_terms=40, num_train=4_000,
                                    num_test=500, seed=4)
_OTHER_SAVED_AT = 5
_CASES = ((_CHECK_CONFIG, _SAVED_AT), (_OTHER_CONFIG, _OTHER_SAVED_AT))  # (config, step) of each checkpoint

Launch = Callable[..., list[Any]]


def _errors() -> tuple[type[BaseException], ...]:
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception

    return (Exception, CheckpointException)


_ERRORS = _errors()


def _launch(launch: Launch | None) -> Launch:
    if launch is None:
        from course_lib import launch as course_launch

        return course_launch
    return launch


def _on_ranks(launch: Launch, fn: Callable[..., Any], *args: Any, world_size: int, what: str) -> list[Any]:
    """`launch(fn, *args)` on `world_size` ranks, silent and bounded: a hang becomes a failed check, not a
    five-minute wait (the learner's code runs inside the ranks, where its exceptions are caught and reported)."""
    from course_lib import LaunchError

    try:
        return launch(fn, *args, world_size=world_size, show_ranks=[], timeout=_TIMEOUT)
    except LaunchError as error:
        # the launch ended the ranks, or a rank's collective gave up first (gloo: "Timed out waiting 60000ms ...")
        if not any(f.kind == "timed out" or "Timed out waiting" in f.headline() for f in error.failures):
            raise
    fail(  # outside the except: the verdict, without the launch's story chained to it
        f"{what} did not finish within {_TIMEOUT:g} s: a rank waited for the others, and they never came",
        "dcp.save and dcp.load are collectives: call them on every rank, with the same checkpoint_id (each "
        "rank writes or reads its own shards; called on rank 0 alone, rank 0 waits for the others forever)",
    )


def _table_wise(world_size: int, config: data.ClickLogConfig = _CHECK_CONFIG) -> dict[str, Any]:
    from torchrec.distributed.sharding_plan import table_wise

    return {t.name: table_wise(rank=i % world_size, compute_kernel="fused") for i, t in enumerate(config.tables(16))}


def _row_wise() -> dict[str, Any]:
    from torchrec.distributed.sharding_plan import row_wise

    return {t.name: row_wise(compute_kernel="fused") for t in _CHECK_CONFIG.tables(16)}


def _other_plan(world_size: int) -> dict[str, Any]:
    """A second plan for exercise 3, one kind per table: an answer that shards the lab's way fails on it."""
    from torchrec.distributed.sharding_plan import column_wise, row_wise, table_wise

    return {"t_user": column_wise(ranks=list(range(world_size)), compute_kernel="fused"),
            "t_item": table_wise(rank=world_size - 1, compute_kernel="fused"),
            "t_category": row_wise(compute_kernel="fused"),
            "t_terms": table_wise(rank=0, compute_kernel="fused")}


_OTHER_PLAN_KINDS = {"t_user": "column_wise", "t_item": "table_wise", "t_category": "row_wise", "t_terms": "table_wise"}


def _shard(per_table: dict[str, Any] | None = None, config: data.ClickLogConfig = _CHECK_CONFIG) -> Any:
    """The lab's DLRM for `config`, built on meta and sharded by `per_table` (default: table-wise) on this group."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel

    from course_lib import models, training

    torch.manual_seed(0)
    model = models.click_dlrm(config.tables(16), config.num_dense, device="meta")
    world_size = dist.get_world_size()
    plan = training.model_plan(model, per_table or _table_wise(world_size, config), world_size=world_size)
    return DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())


def _train(model: Any, optimizer: Any, steps: range, config: data.ClickLogConfig = _CHECK_CONFIG) -> None:
    from course_lib import checkpoint, training

    split = data.make_click_log(config).train
    for step in steps:
        training.train_step(model, optimizer, checkpoint.batch_at(split, step, _BATCH))


def _state(model: Any, optimizer: Any) -> dict[str, torch.Tensor]:
    from course_lib import checkpoint

    return checkpoint.full_tensors({"model": model.state_dict(), "optimizer": optimizer.state_dict()})


def _differences(now: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> dict[str, float]:
    """Largest difference per part: "model", "fused" (the fused Adagrad's momentum), "adam" (Adam's state)."""
    parts = {"model": 0.0, "fused": 0.0, "adam": 0.0}
    for key, value in saved.items():
        part = "model" if key.startswith("model.") else "fused" if "momentum" in key else "adam"
        other = now.get(key)
        difference = float("inf") if other is None or other.shape != value.shape else (other - value).abs().max().item()
        parts[part] = max(parts[part], difference)
    return parts


def _first_line(error: BaseException) -> str:
    """The line that says what went wrong (DCP wraps every rank's traceback into one CheckpointException)."""
    lines = [line for line in str(error).splitlines() if re.match(r"^[A-Za-z_.]*(Error|Exception)\b[^:]*: ", line)]
    if lines:
        return lines[-1][:300]
    return one_line(error)[:300]


def _predict(model: Any, config: data.ClickLogConfig = _CHECK_CONFIG) -> torch.Tensor:
    from course_lib import training

    logits, _ = training.predict(model, data.make_click_log(config).test.rows(0, _ROWS))
    return logits


def _local_copy(value: Any) -> Any:
    """What this rank holds of a (nested) state dict, copied, without a collective: a ShardedTensor's local
    shards, a DTensor's local tensor, a tensor's values; dicts and lists entry by entry; other leaves as they are."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, Mapping):
        return {key: _local_copy(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_local_copy(item) for item in value]
    if isinstance(value, ShardedTensor):
        return ("tensors", [shard.tensor.detach().clone() for shard in value.local_shards()])
    if isinstance(value, DTensor):
        return ("tensors", [value.to_local().detach().clone()])
    if isinstance(value, torch.Tensor):
        return ("tensors", [value.detach().clone()])
    return value


def _change(before: Any, after: Any, where: str = "") -> str | None:
    """The first difference between a `_local_copy` taken before a call and the value after it, in words."""
    name = f"[{where}]" if where else "the state dict"
    if isinstance(before, dict):
        if not isinstance(after, Mapping):
            return f"{name} was replaced by a {type(after).__name__}"
        for key in before:
            if key not in after:
                return f"{name} lost its entry {key!r}"
        for key in after:
            if key not in before:
                return f"{name} got a new entry {key!r}"
        for key in before:
            change = _change(before[key], after[key], f"{where}.{key}" if where else repr(key))
            if change:
                return change
        return None
    now = _local_copy(after)
    if isinstance(before, tuple) and len(before) == 2 and before[0] == "tensors":
        same = (isinstance(now, tuple) and len(now[1]) == len(before[1])
                and all(a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(before[1], now[1])))
        return None if same else f"the tensor {name} was changed in place"
    if isinstance(before, list):
        if not isinstance(now, list) or len(now) != len(before):
            return f"{name} changed length"
        for index, (b, a) in enumerate(zip(before, after)):
            change = _change(b, a, f"{where}[{index}]")
            if change:
                return change
        return None
    if isinstance(after, (torch.Tensor, Mapping, list, tuple)):
        return f"{name} was set to a {type(after).__name__} (was {before!r})"
    return None if before is after or before == after else f"{name} was set to {after!r} (was {before!r})"


def _without_ddp_prefix(app_state: Any, handed: Any) -> Any:
    """`app_state` with the keys of each state dict in it as they were in `handed` (the copy taken before the
    call): torchrec's DMP.load_state_dict prefixes every key of the dict it is given with "module." in place,
    for its DDP wrapper (``add_prefix_to_state_dict`` in torchrec/distributed/utils.py), which is the library's
    doing, not the answer's, under whichever key the answer keeps the model's state."""
    if not isinstance(app_state, Mapping) or not isinstance(handed, Mapping):
        return app_state
    out = {}
    for key, value in app_state.items():
        before = handed.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping) and not any(
                str(k).startswith("module.") for k in before):
            value = {k.removeprefix("module.") if isinstance(k, str) else k: v for k, v in value.items()}
        out[key] = value
    return out


def _fingerprint(folder: str) -> dict[str, str]:
    """Every file of a checkpoint folder and a hash of its bytes: what a load must leave as it found it."""
    return {str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest()
            for p in sorted(Path(folder).rglob("*")) if p.is_file()}


def _rewritten(before: dict[str, str], folder: str) -> str | None:
    """Which files of the checkpoint at `folder` a reload wrote, added or removed, in words (None: untouched)."""
    after = _fingerprint(folder)
    touched = sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
    return ", ".join(touched) if touched else None


def _call_reload(reload: Callable[..., Any], folder: str, config: data.ClickLogConfig,
                 per_table: dict[str, Any]) -> Any:
    """`reload(folder, config, per_table)` on this rank; InputChanged if it changed its config or its plan (an
    entry added, removed or replaced: the plan's values are functions, compared by identity)."""
    entries = dict(per_table)
    app = call_unchanged("reload", reload, folder, config, per_table)
    replaced = [name for name, value in entries.items() if per_table.get(name) is not value]
    if replaced:
        raise InputChanged(f"reload changed its argument 3 (per_table) in place: the entries for {', '.join(replaced)} "
                           "were replaced")
    return app


def _not_an_int(step: Any) -> bool:
    """Whether a restored step is something other than an int (Python's or NumPy's; not a bool): a tensor or a
    float compares equal to the right number, yet breaks the loop that uses it."""
    import numbers

    return step is not None and (not isinstance(step, numbers.Integral) or isinstance(step, bool))


_INT_STEP_HINT = ("keep the step an int: put self.step in the state dict as it is (DCP saves Python ints), not "
                  "torch.tensor(self.step) or float(self.step), and set self.step from it unchanged")
_INT_STEP_RELOAD_HINT = ("return the step as the checkpoint holds it, an int (dcp.load gives back the Python int that "
                         "was saved): do not wrap it in torch.tensor() or float()")


def _fail_not_an_int(step: Any, where: str = "", after: str = "after loading", hint: str = _INT_STEP_HINT) -> None:
    """Fail for a step that came back as a tensor or a float (see `_not_an_int`): what that breaks, and the fix."""
    fail(
        f"{where}app.step is {step!r} {after}, a {type(step).__name__}, not an int: the loop that resumes from it "
        "breaks (checkpoint.step_folder(app.step) formats it with :d, which a float refuses; losses[app.step] keys "
        "a dict by the tensor object, so losses[3] is not found; app.step += 1 changes a tensor in place)",
        hint,
    )


# ------------------------------------------------------------------------------------------ exercise 1


def _app_state_on_rank(app_state_class: type, folder: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _shard()
    optimizer = training.optimizer(model)
    report: dict[str, Any] = {}
    try:
        app = app_state_class(model, optimizer)  # made before training, as a training loop makes it
    except _ERRORS as error:
        raise_if_unwritten(error)
        report["error"] = f"AppState(model, optimizer) raised {_first_line(error)}"
        return report
    _train(model, optimizer, range(_SAVED_AT))
    app.step = _SAVED_AT  # the loop moves the step on: the save must see where it is now
    saved = _state(model, optimizer)
    try:
        dcp.save({"app": app}, checkpoint_id=folder)
    except _ERRORS as error:
        raise_if_unwritten(error)
        report["error"] = f"saving {{'app': AppState(model, optimizer)}} at step {_SAVED_AT} raised {_first_line(error)}"
        return report
    probe: dict[str, Any] = {"app": {"step": None}}  # the step the checkpoint holds, read on its own
    try:
        dcp.load(probe, checkpoint_id=folder)
        report["saved step"] = probe["app"]["step"]
    except _ERRORS:
        pass  # no "step" entry: the load below says what is wrong
    _train(model, optimizer, range(_SAVED_AT, 2 * _SAVED_AT))  # move on, then go back to the checkpoint
    app.step = 2 * _SAVED_AT
    try:
        dcp.load({"app": app}, checkpoint_id=folder)
    except _ERRORS as error:
        report["error"] = f"loading the checkpoint back raised {_first_line(error)}"
        return report
    report["differences"] = _differences(_state(model, optimizer), saved)
    report["step"] = app.step
    # load_state_dict on its own: a fresh app gets a state dict that does not share its tensors (read from the
    # checkpoint into another model's), as from a dcp_to_torch_save file or any load that is not in place
    donor_model = _shard()
    donor_optimizer = training.optimizer(donor_model)
    fresh_model = _shard()
    fresh_optimizer = training.optimizer(fresh_model)
    for each in (donor_optimizer, fresh_optimizer):
        checkpoint.init_optimizer_state(each)
    try:
        state = {"app": app_state_class(donor_model, donor_optimizer, 0).state_dict()}
        dcp.load(state, checkpoint_id=folder)  # a plain dict: filled in place, no load_state_dict called
        fresh = app_state_class(fresh_model, fresh_optimizer, 0)
        handed = _local_copy(state["app"])
        fresh.load_state_dict(state["app"])
    except _ERRORS as error:
        report["fresh_error"] = _first_line(error)
        return report
    report["fresh_changed"] = _change(handed, _without_ddp_prefix(state["app"], handed))  # the caller's: read, not consumed
    report["fresh_differences"] = _differences(_state(fresh_model, fresh_optimizer), saved)
    report["fresh_step"] = fresh.step
    return report


@exercise
def check_app_state(app_state_class: type, launch: Launch | None = None) -> None:
    """`AppState(model, optimizer, step)` must save and restore the model, its whole optimizer, and the step.

    The check makes ``AppState(model, optimizer)`` for the lab's DMP model on 2 ranks, trains 3 steps (moving
    ``app.step`` on, as a training loop does), saves ``{"app": app}`` with ``dcp.save``, trains 3 more steps,
    loads the checkpoint back, and compares every tensor with the saved one.
    """
    folder = tempfile.mkdtemp(prefix="lab08-check-")
    try:
        report = _on_ranks(_launch(launch), _app_state_on_rank, app_state_class, folder, world_size=2,
                           what="saving and loading the AppState")[0]
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if report.get("saved step", _SAVED_AT) == 0:
        fail(
            f"the checkpoint says step 0, but dcp.save ran at step {_SAVED_AT}: state_dict() returned the app as it "
            "was when AppState was made (before any training step), not as it is now",
            "state_dict() must read self.model, self.optimizer and self.step each time it is called (dcp.save calls "
            "it at every save): do not keep a state dict made in __init__",
        )
    if "error" in report:
        fail(report["error"], "state_dict() returns a dict of state dicts (and the step); load_state_dict(state) puts them back")
    differences = report["differences"]
    if differences["model"] > 0:
        fail(
            f"the model's weights were not restored (off by up to {differences['model']:.3g})",
            "state_dict() must include self.model.state_dict(), and load_state_dict() give it back to the model",
        )
    if differences["fused"] > 0 and differences["adam"] > 0:
        fail(
            "the optimizer's state was not restored: neither the tables' Adagrad momentum nor Adam's moments",
            "include self.optimizer.state_dict(): without it a resumed run starts its optimizer from scratch",
        )
    if differences["fused"] > 0:
        fail(
            f"the fused optimizer's state (the tables' Adagrad momentum) was not restored (off by {differences['fused']:.3g})",
            "the tables' optimizer lives in model.fused_optimizer; self.optimizer (the CombinedOptimizer) includes it",
        )
    if differences["adam"] > 0:
        fail(
            f"Adam's state for the dense part was not restored (off by {differences['adam']:.3g})",
            "model.fused_optimizer only holds the tables' optimizer: save self.optimizer, which combines both",
        )
    if _not_an_int(report["step"]):
        _fail_not_an_int(report["step"], after=f"after loading a checkpoint taken at step {_SAVED_AT}")
    if report["step"] != _SAVED_AT:
        fail(
            f"the step was not restored: app.step is {report['step']} after loading a checkpoint taken at step {_SAVED_AT}",
            "put the step in state_dict() and set self.step from it in load_state_dict(): the data order and the "
            "learning-rate schedule depend on it",
        )
    in_place = ("dcp.load looked right only because it copies into the very tensors your state_dict() returned "
                "(in place), before it calls load_state_dict()")
    if "fresh_error" in report:
        fail(f"load_state_dict() of a fresh AppState, given a state dict read from the checkpoint, raised "
             f"{report['fresh_error']}",
             "load_state_dict(state_dict) gets back exactly what state_dict() returned: give each part to its owner")
    fresh = report["fresh_differences"]
    lost = [part for part, key in (("the model's weights", "model"), ("the fused Adagrad state", "fused"),
                                   ("Adam's state", "adam")) if fresh[key] > 0]
    if lost:
        fail(
            f"load_state_dict() does not restore {' nor '.join(lost)}: a fresh AppState given a state dict read "
            f"from the checkpoint keeps its own; {in_place}",
            "in load_state_dict, hand each part to its owner: self.model.load_state_dict(state_dict['model']) and "
            "self.optimizer.load_state_dict(state_dict['optimizer']) (a state dict loaded any other way, e.g. from "
            "a dcp_to_torch_save file, shares no tensor with your model)",
        )
    if _not_an_int(report["fresh_step"]):
        _fail_not_an_int(report["fresh_step"], after="after load_state_dict() alone")
    if report["fresh_step"] != _SAVED_AT:
        fail(f"load_state_dict() leaves the step at {report['fresh_step']}, the state dict says {_SAVED_AT}",
             "set self.step from the state dict in load_state_dict()")
    if report["fresh_changed"]:
        fail(
            f"load_state_dict() changed the state dict it was handed: {report['fresh_changed']}; the caller's dict "
            "(kept to log its step, or read once from a file and handed to several apps) no longer holds what was "
            "loaded",
            "read from state_dict, do not consume it: state_dict['step'], not state_dict.pop('step'); nothing in "
            "load_state_dict needs to write into the dict it is given",
        )
    passed("AppState restores the weights, the fused Adagrad state, Adam's state and the step, in place (dcp.load) "
           "and through load_state_dict() alone")


# ------------------------------------------------------------------------------------------ exercise 2

_SECOND_SAVE_AT = 5  # the step of the check's second save
_KEEP = 3  # the keep the check passes in its second folder (the lab's default is 2)
_KEPT_STEPS = (6, 7, 8, 9)  # saved with keep=3: 7, 8 and 9 remain
_FAILED_AT = 10  # rank 1's write fails in this save: 7, 8 and 9 must remain
_AFTER_FAILURE = 11  # then a save that works: the three newest complete ones are 8, 9 and 11


class _Deletions:
    """Records, on this rank, every file or folder removed while it is active (os.unlink / os.remove / os.rmdir,
    shutil.rmtree), and whether the checkpoint being saved was complete (had its .metadata) at that moment."""

    def __init__(self) -> None:
        self.log: list[dict[str, Any]] = []
        self.saving: str | None = None  # the folder the current save writes

    def __enter__(self) -> "_Deletions":
        self._saved = {name: getattr(os, name) for name in ("unlink", "remove", "rmdir")}
        self._rmtree = shutil.rmtree
        for name, original in self._saved.items():
            setattr(os, name, self._recording(name, original))
        shutil.rmtree = self._recording("rmtree", self._rmtree)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name, original in self._saved.items():
            setattr(os, name, original)
        shutil.rmtree = self._rmtree

    def _recording(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def removing(path: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("dir_fd") is None and self._depth == 0:  # rmtree's own inner calls are one removal
                complete = self.saving is not None and os.path.isfile(os.path.join(self.saving, ".metadata"))
                self.log.append({"call": name, "path": os.fspath(path), "new one complete": complete})
            self._depth += 1
            try:
                return original(path, *args, **kwargs)
            finally:
                self._depth -= 1

        return removing

    _depth = 0


def _complete_steps(root: str) -> list[int]:
    """The steps of the complete checkpoints under `root` (step folders with DCP's .metadata)."""
    folders = Path(root).glob("step_*") if os.path.isdir(root) else []
    return sorted(int(p.name.split("_")[1]) for p in folders if (p / ".metadata").is_file())


def _failing_writes() -> Any:
    """While active, this rank's DCP file writes raise, as a full disk or a lost mount would."""
    from unittest import mock

    from torch.distributed.checkpoint.filesystem import _FileSystemWriter

    def write_data(*args: Any, **kwargs: Any) -> Any:
        raise OSError("[the check] rank 1's storage failed while writing its shards")

    return mock.patch.object(_FileSystemWriter, "write_data", write_data)


def _keep_on_rank(save: Callable[..., Any], model: Any, optimizer: Any, root: str) -> dict[str, Any]:
    """The keep part of the check, on every rank: saves with keep=_KEEP at _KEPT_STEPS, one whose writes fail on
    rank 1, one more; what remains after each, whether the failed one raised, and what this rank deleted."""
    import contextlib

    import torch.distributed as dist

    from course_lib import checkpoint

    rank = dist.get_rank()
    report: dict[str, Any] = {}
    deletions = _Deletions()
    with deletions:
        for step in _KEPT_STEPS:
            deletions.saving = os.path.join(root, checkpoint.step_folder(step))
            try:
                save(checkpoint.AppState(model, optimizer, step), root, keep=_KEEP)
            except _ERRORS as error:
                report["error"] = f"save(app, root, keep={_KEEP}) at step {step} raised {_first_line(error)}"
                return report
            dist.barrier()
        report["kept"] = _complete_steps(root)
        deletions.saving = os.path.join(root, checkpoint.step_folder(_FAILED_AT))
        with _failing_writes() if rank == 1 else contextlib.nullcontext():
            try:
                save(checkpoint.AppState(model, optimizer, _FAILED_AT), root, keep=_KEEP)
                report["failed save raised"] = False
            except _ERRORS as error:
                report["failed save raised"] = True
                report["failure"] = _first_line(error)
        dist.barrier()
        report["after failure"] = _complete_steps(root)
        deletions.saving = os.path.join(root, checkpoint.step_folder(_AFTER_FAILURE))
        try:
            save(checkpoint.AppState(model, optimizer, _AFTER_FAILURE), root, keep=_KEEP)
        except _ERRORS as error:
            report["error"] = (f"save(app, root, keep={_KEEP}) at step {_AFTER_FAILURE}, after a failed save, raised "
                               f"{_first_line(error)}")
            return report
        dist.barrier()
        report["after recovery"] = _complete_steps(root)
    report["deletions"] = deletions.log
    return report


def _save_on_rank(save: Callable[..., Any], root: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _shard()
    optimizer = training.optimizer(model)
    _train(model, optimizer, range(_SAVED_AT))
    saved = _state(model, optimizer)
    report: dict[str, Any] = {}
    first_root = os.path.join(root, "default")
    deletions = _Deletions()
    try:
        app = checkpoint.AppState(model, optimizer, _SAVED_AT)
        with deletions:
            deletions.saving = os.path.join(first_root, checkpoint.step_folder(_SAVED_AT))
            returned = save(app, first_root)
    except _ERRORS as error:
        raise_if_unwritten(error)
        report["error"] = f"save(app, root) raised {_first_line(error)}"
        return report
    import torch.distributed as dist

    dist.barrier()
    # save only reads the app: the job goes on training from it (an optimizer.step() "to make the state exist"
    # applies the last gradients a second time; a model moved to meta has no weights left)
    try:
        after = _state(model, optimizer)
        changed = [part for part, difference in _differences(after, saved).items() if difference > 0]
    except _ERRORS as error:
        changed = [f"the model and optimizer can no longer be read ({_first_line(error)})"]
    if app.step != _SAVED_AT:
        changed.append(f"the step (now {app.step})")
    report["changed"] = changed
    report["returned"] = None if returned is None else os.fspath(returned)
    report["files"] = sorted(str(p.relative_to(first_root)) for p in Path(first_root).rglob("*") if p.is_file())
    folder = checkpoint.latest(first_root)
    report["latest"] = None if folder is None else str(folder)
    if folder is None:
        return report
    report["keys"] = list(checkpoint.contents(folder).index)
    fresh = _shard()
    fresh_optimizer = training.optimizer(fresh)
    checkpoint.init_optimizer_state(fresh_optimizer)
    app = checkpoint.AppState(fresh, fresh_optimizer)
    try:
        dcp.load({"app": app}, checkpoint_id=folder)
    except _ERRORS as error:
        report["load_error"] = _first_line(error)
        return report
    report["differences"] = _differences(_state(fresh, fresh_optimizer), saved)
    report["step"] = app.step
    # a second save, steps later: a folder typed in (the step_000003 the check's ✓ shows) is right at step 3 only
    if changed:  # the check fails on the change first; the model may not even train on
        return report
    _train(model, optimizer, range(_SAVED_AT, _SECOND_SAVE_AT))
    try:
        with deletions:
            deletions.saving = os.path.join(first_root, checkpoint.step_folder(_SECOND_SAVE_AT))
            second = save(checkpoint.AppState(model, optimizer, _SECOND_SAVE_AT), first_root)
    except _ERRORS as error:
        report["second error"] = _first_line(error)
        return report
    dist.barrier()
    report["second returned"] = None if second is None else os.fspath(second)
    report["second latest"] = None if checkpoint.latest(first_root) is None else str(checkpoint.latest(first_root))
    report["default kept"] = _complete_steps(first_root)
    report["keep"] = _keep_on_rank(save, model, optimizer, os.path.join(root, "keep"))
    report["keep"]["deletions"] = deletions.log + report["keep"].get("deletions", [])
    return report


def _folder(step: int) -> str:
    from course_lib import checkpoint

    return checkpoint.step_folder(step)


def _steps(steps: list[int]) -> str:
    return "[" + ", ".join(_folder(s) for s in steps) + "]"


def _judge_keep(reports: list[dict[str, Any]]) -> None:
    """Fail with what the keep part of the check found wrong, from every rank's report."""
    keep = reports[0]["keep"]
    if "error" in keep:
        fail(keep["error"], "save(app, root, keep=...) takes keep as its third argument: the check passes another "
             "keep than the lab's default")
    if reports[0]["default kept"] != [_SAVED_AT, _SECOND_SAVE_AT]:
        fail(f"after saves at steps {_SAVED_AT} and {_SECOND_SAVE_AT} with the default keep (2), the complete "
             f"checkpoints under root are {_steps(reports[0]['default kept'])}",
             "both fit in keep=2: delete only checkpoints beyond the newest keep")
    deleters = [rank for rank, report in enumerate(reports) if report["keep"].get("deletions")]
    if len(deleters) > 1:
        fail(f"ranks {deleters} all delete old checkpoints: on a shared file system they race on the same folders, "
             "and one of them meets a folder the other has just removed (FileNotFoundError), or a half-removed one",
             "the checkpoint folders are shared by all ranks: let one rank (rank 0) delete")
    want = list(_KEPT_STEPS[-_KEEP:])
    if keep["kept"] != want:
        fail(f"after saves at steps {', '.join(map(str, _KEPT_STEPS))} with keep={_KEEP}, the complete checkpoints "
             f"under root are {_steps(keep['kept'])}; expected the newest {_KEEP}, {_steps(want)}",
             "sort the step folders by name (step_folder pads the step, so names sort by step) and delete all but "
             "the last keep, counting the one just written" if len(keep["kept"]) != _KEEP else
             "keep the newest checkpoints, the last ones when sorted by step, not the oldest")
    failed = [rank for rank, report in enumerate(reports) if not report["keep"]["failed save raised"]]
    if failed:
        fail(f"rank 1's writes failed in the save at step {_FAILED_AT}, but save returned normally on rank(s) "
             f"{failed}: the job goes on as if it had a checkpoint of step {_FAILED_AT}",
             "let dcp.save's exception (a CheckpointException, a BaseException) propagate: do not catch it")
    if keep["after failure"] != want:
        fail(f"rank 1's writes failed in the save at step {_FAILED_AT}; afterwards the complete checkpoints are "
             f"{_steps(keep['after failure'])}, expected {_steps(want)} still there: a failed save must not cost the "
             "checkpoints a restart needs",
             "delete old checkpoints only after the new one is complete on every rank: dcp.save raises on every "
             "rank when one fails, so nothing after it runs")
    early = [d for report in reports for d in report["keep"].get("deletions", []) if not d["new one complete"]]
    if early:
        fail(f"save deleted {os.path.basename(early[0]['path'])} before the checkpoint it was writing was complete: "
             "a failure in this save would leave fewer checkpoints than keep, maybe none",
             "save first (dcp.save returns once every rank has written and .metadata exists), then delete the oldest")
    want = sorted([*want, _AFTER_FAILURE])[-_KEEP:]
    if keep["after recovery"] != want:
        fail(f"after the failed save at step {_FAILED_AT} and a good one at step {_AFTER_FAILURE}, the complete "
             f"checkpoints are {_steps(keep['after recovery'])}; expected the newest {_KEEP} complete ones, "
             f"{_steps(want)}",
             f"the failed save left {_folder(_FAILED_AT)} without DCP's .metadata: it is not a checkpoint. "
             "Count only folders that hold .metadata (remove the others or leave them)")


@exercise
def check_save(save: Callable[..., Any], launch: Launch | None = None) -> None:
    """`save(app, root, keep=2)` must write a DCP checkpoint of `app` (every rank its shards) into
    ``root / checkpoint.step_folder(app.step)``, return that folder, and then keep only the newest `keep`
    complete checkpoints under `root`, one rank deleting the others, never before the new one is complete.

    The check trains 3 steps on 2 ranks, calls `save`, then loads the newest checkpoint under `root` into a
    freshly sharded model and optimizer and compares every tensor and the step; then trains 2 more steps and
    saves again, at step 5, where the folder (returned, and the newest under `root`) must be that step's. In
    another root, with keep=3, it saves at steps 6 to 9, then at step 10 with rank 1's file writes failing,
    then at step 11; after each it lists the complete checkpoints, and it records which rank deletes, and when.
    """
    from course_lib import checkpoint

    root = tempfile.mkdtemp(prefix="lab08-check-")
    try:
        reports = _on_ranks(_launch(launch), _save_on_rank, save, root, world_size=2, what="save(app, root)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = reports[0]
    root = os.path.join(root, "default")
    if "error" in report:
        fail(report["error"])
    if report["changed"]:
        words = {"model": "the model's weights", "fused": "the fused Adagrad state", "adam": "Adam's state"}
        what = ", ".join(words.get(part, part) for part in report["changed"])
        fail(
            f"save changed the app it was handed: {what}"
            + (" after the call" if what.startswith("the model and optimizer can no longer") else
               " differ after the call from before it")
            + ", so the job cannot train on from the state it saved",
            "save only reads the app: dcp.save({'app': app}, checkpoint_id=folder) calls app.state_dict() and "
            "writes it; do not step the optimizer, move the model or change the step (the lazy optimizer state "
            "matters before a load, not before a save)",
        )
    want = os.path.join(root, checkpoint.step_folder(_SAVED_AT))
    if report["latest"] is None:
        files = report["files"]
        if any(name.endswith(".metadata") for name in files):
            fail(
                f"a checkpoint was written, but not into a step folder: {files}",
                f"save into os.path.join(root, checkpoint.step_folder(app.step)) ({checkpoint.step_folder(_SAVED_AT)} "
                "here), so that every checkpoint has its own folder and checkpoint.latest(root) finds the newest",
            )
        fail(
            f"no DCP checkpoint under root; the files written were {files or 'none'}",
            "call dcp.save({'app': app}, checkpoint_id=...) on every rank: each rank writes its own shards and "
            "the coordinator the .metadata. torch.save of rank 0's state_dict() holds only rank 0's shards "
            "(and ShardedTensors that need a process group to unpickle)",
        )
    if "load_error" in report:
        writers = {m.group(1) for m in (re.match(r"(?:.*/)?__(\d+)_\d+\.distcp$", f) for f in report["files"]) if m}
        if writers == {"0"}:
            fail(
                f"only rank 0 wrote its shards ({', '.join(f for f in report['files'] if f.endswith('.distcp'))}): "
                f"the checkpoint lacks what rank 1 holds, so it cannot be loaded ({report['load_error']})",
                "call dcp.save on every rank, with the same checkpoint_id and without no_dist: each rank writes its "
                "own shards (a table-wise table lives on one rank only)",
            )
        keys = report.get("keys", [])
        has_optimizer = any(".optimizer." in key or key.startswith("optimizer") for key in keys)
        fail(
            f"the checkpoint cannot be loaded as {{'app': AppState(model, optimizer)}}: {report['load_error']}",
            "save the whole app state under the key 'app': dcp.save({'app': app}, ...)"
            + ("" if has_optimizer else "; the checkpoint holds no optimizer state at all"),
        )
    if os.path.normpath(report["returned"] or "") != os.path.normpath(want):
        fail(f"save returned {report['returned']!r}, expected the folder it wrote ({want!r})", "return the checkpoint_id you saved to")
    differences = report["differences"]
    if max(differences.values()) > 0 or report["step"] != _SAVED_AT:
        fail(
            f"loading the checkpoint back gives different tensors ({differences}) or step ({report['step']})",
            "save the app state itself: dcp.save({'app': app}, checkpoint_id=folder)",
        )
    if "second error" in report:
        fail(f"a second save(app, root), at step {_SECOND_SAVE_AT}, raised {report['second error']}",
             "each save writes a folder of its own, named by app.step: os.path.join(root, checkpoint.step_folder(app.step))")
    second_want = os.path.join(root, checkpoint.step_folder(_SECOND_SAVE_AT))
    if (os.path.normpath(report["second returned"] or "") != os.path.normpath(second_want)
            or os.path.normpath(report["second latest"] or "") != os.path.normpath(second_want)):
        fail(f"a second save(app, root), at step {_SECOND_SAVE_AT}, returned {report['second returned']!r}, and the "
             f"newest checkpoint under root is {report['second latest']!r}; expected {second_want!r}: the folder does "
             "not follow app.step (typed in, or counted apart), so every later save lands in the same folder",
             "name the folder from the app's step: os.path.join(root, checkpoint.step_folder(app.step))")
    _judge_keep(reports)
    passed(f"save writes a DCP checkpoint into {checkpoint.step_folder(_SAVED_AT)}/ that restores everything; with "
           f"keep={_KEEP}, the newest {_KEEP} complete checkpoints remain, and a failed save costs none of them")



# ------------------------------------------------------------------------------------------ exercise 3

def _reference_on_rank(folders: list[str]) -> list[dict[str, Any]]:
    """On each of 2 ranks: one checkpoint per case of `_CASES` (its config, trained table-wise to its step), saved
    into its folder of `folders`; what each model holds and predicts."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    saved = []
    for folder, (config, steps) in zip(folders, _CASES):
        model = _shard(_table_wise(dist.get_world_size(), config), config)
        optimizer = training.optimizer(model)
        _train(model, optimizer, range(steps), config)
        dcp.save({"app": checkpoint.AppState(model, optimizer, steps)}, checkpoint_id=folder)
        saved.append({"state": _state(model, optimizer), "logits": _predict(model, config)})
    return saved


def _plans(world_size: int) -> list[dict[str, Any]]:
    """The plan exercise 3's reload gets for each case: every table row-wise, then one kind per table."""
    return [_row_wise(), _other_plan(world_size)]


def _reload_on_rank(reload: Callable[[str, Any, dict[str, Any]], Any], folders: list[str]) -> list[dict[str, Any]]:
    """On each rank: the learner's reload of each checkpoint of `folders` (with its config and plan), what it holds."""
    import torch.distributed as dist

    from course_lib import training

    reports: list[dict[str, Any]] = []
    for folder, (config, _), per_table in zip(folders, _CASES, _plans(dist.get_world_size())):
        try:
            app = _call_reload(reload, folder, config, per_table)
            model, optimizer, step = app.model, app.optimizer, app.step
        except InputChanged as changed:
            reports.append({"changed": str(changed)})
            break
        except _ERRORS as error:
            raise_if_unwritten(error)
            reports.append({"error": _first_line(error)})
            break
        reports.append({
            "sharding": training.sharding_types(model),
            "state": _state(model, optimizer),
            "logits": _predict(model, config),
            "step": step,
        })
    return reports


def _reloads(launch: Launch, reload: Callable[..., Any], on_ranks: Callable[..., Any], world_size: int,
             what: str) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Save the checkpoints of `_CASES` on 2 ranks, then run `on_ranks(reload, folders)` on `world_size` ranks.
    Returns the references (state and logits of each checkpoint) and each rank's reports; fails the check if the
    learner's code changed an argument on any rank, or wrote into a checkpoint it was handed."""
    folders = [tempfile.mkdtemp(prefix="lab08-check-") for _ in _CASES]
    try:
        saved = _on_ranks(launch, _reference_on_rank, folders, world_size=2, what="saving the reference checkpoints")
        references = [{"state": saved[0][case]["state"], "logits": torch.cat([rank[case]["logits"] for rank in saved])}
                      for case in range(len(_CASES))]
        before = [_fingerprint(folder) for folder in folders]
        with warnings.catch_warnings():  # launch notes that 4 ranks take turns on a 2-core laptop: known here
            warnings.filterwarnings("ignore", message="launch: .* ranks on .* CPU cores", category=UserWarning)
            results = _on_ranks(launch, on_ranks, reload, folders, world_size=world_size, what=what)
        rewritten = [_rewritten(fingerprint, folder) for fingerprint, folder in zip(before, folders)]
    finally:
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)
    changed = next((report["changed"] for rank in results for report in rank if "changed" in report), None)
    if changed:
        fail(f"{changed}: the caller's path, config and plan must be as they were after the call",
             "the caller still needs what it handed over (the next reload, a retry, its own plan): leave path, config "
             "and per_table as they are; for another plan, make a new dict ({**per_table, name: ...})")
    for case, files in enumerate(rewritten):
        if files:
            fail(
                f"reload wrote into the checkpoint it was handed ({'the second' if case else 'the first'} one: {files} "
                "changed): a checkpoint is the job's history, and the next load (a retry, another job, the "
                "instructor's) reads what your reload left, not what was saved",
                "reload only reads: dcp.load into the new model's AppState; to keep a resharded copy, dcp.save it "
                "into a folder of its own",
            )
    return references, results


def _mismatch(error: str) -> str | None:
    """What a "Size mismatch" from dcp.load in the second case says the answer did: read a checkpoint other than
    its path, or built the model from a config other than its config (None: another error)."""
    sizes = re.search(r"Size mismatch between saved torch\.Size\(\[(\d+), \d+\]\) and current: torch\.Size\(\[(\d+), \d+\]\)", error)
    if not sizes:
        return None
    saved_rows, built_rows = int(sizes[1]), int(sizes[2])
    first, other = list(_CHECK_CONFIG.num_embeddings.values()), list(_OTHER_CONFIG.num_embeddings.values())
    rows = ", ".join(map(str, other))
    if saved_rows in first and saved_rows not in other:
        return (f"reload read a checkpoint other than the path it was handed: given a second checkpoint, whose tables "
                f"have {rows} rows, it loaded a table of {saved_rows} rows, from the first checkpoint it was given "
                "(or one of the lab's)")
    if built_rows not in other:
        return (f"reload built its tables from a config other than the one it was handed: given a config whose "
                f"tables have {rows} rows, it built a table of {built_rows} rows (the lab's log.config has "
                f"{', '.join(map(str, first))}), so it is right only at the lab's sizes")
    return None


def _judge_reload(results: list[list[dict[str, Any]]], references: list[dict[str, Any]], case: int) -> float:
    """Fail with what is wrong with the reload of case `case`; return its largest prediction gap."""
    report = results[0][case]
    config, step = _CASES[case]
    where = (f"with a second checkpoint (tables of {_OTHER_CONFIG.num_users}, {_OTHER_CONFIG.num_items}, "
             f"{_OTHER_CONFIG.num_categories}, {_OTHER_CONFIG.num_terms} rows, step {step}) and a second plan, "
             if case else "")
    if "error" in report:
        mismatch = _mismatch(report["error"]) if case else None
        if mismatch:
            fail(f"{mismatch} ({report['error']})",
                 "use the arguments: shard(config, per_table) builds the model the checkpoint at path was saved from")
        fail(f"{where}reload raised {report['error']}", "see the cells above: shard, build the optimizer, then dcp.load")
    if case == 0:
        kinds = {kind for kind, _ in report["sharding"].values()}
        if kinds != {"row_wise"}:
            fail(
                f"the reloaded model's tables are {sorted(kinds) or 'not sharded'}, the plan asks for row_wise",
                "shard with the plan made from per_table for this world size: training.model_plan(model, per_table, ...)",
            )
    else:
        kinds = {table: kind for table, (kind, _) in report["sharding"].items()}
        if kinds != _OTHER_PLAN_KINDS:
            fail(
                f"{where}the reloaded tables are sharded {kinds}, the plan it was handed asks for {_OTHER_PLAN_KINDS}: "
                "reload does not shard by its per_table argument",
                "shard with the plan made from per_table (shard(config, per_table)), not with a layout of the lab",
            )
    if case and report["step"] == _SAVED_AT and step != _SAVED_AT:
        fail(
            f"{where}reload returned step {report['step']}, the step of the first checkpoint it was given: it does "
            "not load from the path it is handed",
            "dcp.load(..., checkpoint_id=path): the path argument, not a checkpoint of the lab",
        )
    reference = references[case]
    logits = torch.cat([rank[case]["logits"] for rank in results])
    prediction_gap = (logits - reference["logits"]).abs().max().item() if logits.shape == reference["logits"].shape else float("inf")
    differences = _differences(report["state"], reference["state"])
    if differences["model"] > 1e-6:
        dense_equal = all(
            torch.equal(report["state"].get(k, torch.empty(0)), v)
            for k, v in reference["state"].items()
            if k.startswith("model.") and "embedding_bags" not in k
        )
        fail(
            f"{where}the reloaded model predicts differently (by up to {prediction_gap:.3g}): its "
            + ("tables were not restored, its dense part was" if dense_equal else "weights were not restored"),
            "load after sharding: DistributedModelParallel builds new tables when it shards a model, so weights "
            "loaded into an unsharded model on the CPU are lost (and every rank would hold every table)"
            if dense_equal
            else "dcp.load the checkpoint into the sharded model's AppState",
        )
    if differences["fused"] > 0 and differences["adam"] > 0:
        fail(
            f"{where}the optimizer's state was not restored",
            "load the whole AppState (model and optimizer) after building the optimizer of the sharded model",
        )
    if differences["adam"] > 0:
        fail(
            f"{where}Adam's state was not restored (off by {differences['adam']:.3g}), though no error was raised",
            "a fresh Adam has no state to load into: call checkpoint.init_optimizer_state(optimizer) before dcp.load",
        )
    if differences["fused"] > 0:
        fail(f"{where}the fused optimizer's state was not restored (off by {differences['fused']:.3g})", "load the optimizer too")
    if _not_an_int(report["step"]):
        _fail_not_an_int(report["step"], where, after="after reload", hint=_INT_STEP_RELOAD_HINT)
    if report["step"] != step:
        fail(f"{where}the reloaded step is {report['step']}, the checkpoint was taken at step {step}",
             "return the AppState you loaded into")
    return prediction_gap


@exercise
def check_reload(reload: Callable[[str, Any, dict[str, Any]], Any], world_size: int = 4, launch: Launch | None = None) -> None:
    """`reload(path, config, per_table)`, run on every rank, must return an AppState whose model is sharded by
    `per_table` on this world size and holds the checkpoint's weights, optimizer state and step, without changing
    its arguments or the checkpoint.

    The check saves two checkpoints on 2 ranks (every table table-wise): the lab's tables at step 3, and tables
    of other sizes at step 5. It runs `reload` on `world_size` ranks, first with every table row-wise, then the
    second checkpoint with one kind of sharding per table, and compares predictions on a fixed batch and every
    tensor.
    """
    references, results = _reloads(_launch(launch), reload, _reload_on_rank, world_size, f"reload on {world_size} ranks")
    prediction_gap = max(_judge_reload(results, references, case) for case in range(len(_CASES)))
    passed(
        f"reload on {world_size} ranks restores 2-rank table-wise checkpoints of two table sizes, row-wise and with a "
        "mixed plan (column-, table- and row-wise tables): predictions within "
        # the row-wise sums' last bits move with the CPU: name the bound they meet, not the gap of this machine
        f"{'1e-06' if prediction_gap <= 1e-6 else f'{prediction_gap:.1g}'}, optimizer state and step exact"
    )


# ------------------------------------------------------------------------------------------ exercise 4


def mixed_layout() -> dict[str, Any]:
    """The layout of exercise 4: t_user and t_item row-wise on the fused kernel (Adagrad in backward, as saved),
    t_category and t_terms data-parallel (plain replicas, trained by Adam)."""
    from torchrec.distributed.sharding_plan import data_parallel, row_wise

    return {"t_user": row_wise(compute_kernel="fused"), "t_item": row_wise(compute_kernel="fused"),
            "t_category": data_parallel(), "t_terms": data_parallel()}


_STAY_FUSED = ("t_user", "t_item")
_BECOME_DENSE = ("t_category", "t_terms")
# A second layout, with other tables moving: a reload that names the tables of mixed_layout() fails on it.
_OTHER_STAY_FUSED = ("t_item", "t_category")
_OTHER_BECOME_DENSE = ("t_user", "t_terms")


def _layout(stay_fused: tuple[str, ...]) -> dict[str, Any]:
    """`stay_fused` row-wise on the fused kernel, every other table data-parallel."""
    from torchrec.distributed.sharding_plan import data_parallel, row_wise

    return {t.name: row_wise(compute_kernel="fused") if t.name in stay_fused else data_parallel()
            for t in _CHECK_CONFIG.tables(16)}


_MIXED_LAYOUTS = ((_STAY_FUSED, _BECOME_DENSE), (_OTHER_STAY_FUSED, _OTHER_BECOME_DENSE))  # one per case of _CASES


def _mixed_on_rank(reload: Callable[[str, Any, dict[str, Any]], Any], folders: list[str]) -> list[dict[str, Any]]:
    """On each rank: the learner's reload of each checkpoint of `folders` (with its config) into its layout of
    `_MIXED_LAYOUTS` (the first is mixed_layout() itself), what it holds."""
    from course_lib import checkpoint, training

    reports: list[dict[str, Any]] = []
    for folder, (config, _), (stay_fused, _) in zip(folders, _CASES, _MIXED_LAYOUTS):
        per_table = mixed_layout() if stay_fused == _STAY_FUSED else _layout(stay_fused)
        fresh_model = _shard(per_table, config)  # what an optimizer that loaded nothing holds for the new Adam tables
        fresh_optimizer = training.optimizer(fresh_model)
        checkpoint.init_optimizer_state(fresh_optimizer)
        fresh = _state(fresh_model, fresh_optimizer)
        try:
            app = _call_reload(reload, folder, config, per_table)
            model, optimizer, step = app.model, app.optimizer, app.step
        except InputChanged as changed:
            reports.append({"changed": str(changed)})
            break
        except _ERRORS as error:
            raise_if_unwritten(error)
            reports.append({"error": _first_line(error)})
            break
        reports.append({"sharding": training.sharding_types(model), "state": _state(model, optimizer),
                        "fresh": fresh, "logits": _predict(model, config), "step": step})
    return reports


def _largest_difference(now: dict[str, torch.Tensor], want: dict[str, torch.Tensor], keys: list[str]) -> float:
    worst = 0.0
    for key in keys:
        other = now.get(key)
        worst = max(worst, float("inf") if other is None or other.shape != want[key].shape
                    else (other - want[key]).abs().max().item())
    return worst


def _judge_mixed(report: dict[str, Any], reference: dict[str, torch.Tensor], stay: tuple[str, ...],
                 become: tuple[str, ...], other: bool, saved_at: int = _SAVED_AT) -> None:
    """Fail with what is wrong with `report`, the learner's reload into the layout where `stay` stay fused and
    `become` become data-parallel, of a checkpoint taken at step `saved_at`; `other`: that layout is not the
    lab's mixed_layout() (and the checkpoint is the second one, of other table sizes)."""
    stay_names, become_names = " and ".join(stay), " and ".join(become)
    where = (f"with another layout ({become_names} data-parallel, {stay_names} fused) and a second checkpoint "
             f"(other table sizes, step {saved_at}), " if other else "")
    generic = ("; decide from per_table (or from what the checkpoint holds) which tables moved, not from the "
               "table names of mixed_layout()" if other else "")
    mismatch = _mismatch(report.get("error", "")) if other else None
    if mismatch:
        fail(f"{mismatch} ({report['error']})",
             "use the arguments: shard(config, per_table) builds the model the checkpoint at path was saved from")
    if other and report.get("step") == _SAVED_AT != saved_at:
        fail(f"{where}reload returned step {report['step']}, the step of the first checkpoint it was given: it does "
             "not load from the path it is handed", "dcp.load(..., checkpoint_id=path): the path argument")
    if "error" in report:
        missing = "Missing key" in report["error"]
        fail(f"{where}reload raised {report['error']}",
             f"the checkpoint holds Adagrad state for {become_names} and no Adam state: a load that asks for "
             "the new optimizer's whole state cannot be served; decide which parts to ask for" + generic if missing else
             "shard by per_table, build the optimizer, make its state exist, then dcp.load what the checkpoint has")
    kinds = {table: kind for table, (kind, _) in report["sharding"].items()}
    want = {table: ("row_wise" if table in stay else "data_parallel") for table in (*stay, *become)}
    if kinds != want:
        fail(f"{where}the reloaded tables are sharded {kinds}, the layout asks for {want}",
             "shard with the plan made from per_table (shard(config, per_table))")
    state, fresh = report["state"], report["fresh"]
    weights = [k for k in reference if k.startswith("model.")]
    if _largest_difference(state, reference, weights) > 1e-6:
        fail(f"{where}the reloaded weights are not the checkpoint's",
             "load the model's state dict (every table, whatever its new layout, and the dense part)")
    if _not_an_int(report["step"]):
        _fail_not_an_int(report["step"], where, after="after reload", hint=_INT_STEP_RELOAD_HINT)
    if report["step"] != saved_at:
        fail(f"{where}the reloaded step is {report['step']}, the checkpoint was taken at step {saved_at}",
             "load the step too: the data order and any schedule depend on it")
    fused_keys = [k for k in reference if "momentum" in k and any(f".{t}." in k for t in stay)]
    if _largest_difference(state, reference, fused_keys) > 0:
        fail(f"{where}the Adagrad state of {stay_names} (which stay on the fused kernel) was not restored",
             "their optimizer did not change: the checkpoint's momentum is theirs, keep it (only the tables that "
             "moved to Adam have nothing to load)" + generic)
    dense_keys = [k for k in reference if k.startswith("optimizer.") and "embedding_bags" not in k]
    if _largest_difference(state, reference, dense_keys) > 0:
        fail(f"{where}Adam's state of the dense part was not restored, though the checkpoint holds it",
             "load the optimizer state of every parameter whose optimizer did not change (make a fresh Adam's state "
             "exist first: checkpoint.init_optimizer_state)")
    moved = [k for k in fresh if k.startswith("optimizer.") and any(f".{t}." in k for t in become)]
    given = [k for k in moved if k in state]  # none: the answer gave them no state, and Adam makes it at their first step
    moments = [k for k in given if not k.endswith(".step")]
    if any(state[k].shape != fresh[k].shape or bool(state[k].abs().max() > 0) for k in moments):
        fail(f"{where}the Adam state of {become_names} is not a fresh one: it was made up from something else",
             "an Adagrad accumulator is not Adam's moments: let the tables that moved to Adam start their optimizer "
             "from scratch" + generic)
    steps = sorted({float(state[k]) for k in given if k.endswith(".step")})
    if steps and steps != [0.0]:
        counted = steps[-1]
        slower = 1 - _first_update_ratio(counted)
        fail(f"{where}the Adam state of {become_names} has zero moments but has counted {counted:g} step"
             f"{'s' if counted != 1 else ''} already: their first update will be {slower:.0%} smaller than a new "
             "Adam's (its bias correction starts from that step), and their step count stays off for good",
             "checkpoint.init_optimizer_state makes the state exist by taking one step with a learning rate of 0: "
             "for the tables the checkpoint has no Adam state for, set that step back to 0 after the load (or give "
             "them no state at all)")


def _first_update_ratio(steps: float, betas: tuple[float, float] = (0.9, 0.999)) -> float:
    """How large Adam's first update is, with zero moments that have counted `steps` steps, next to a new Adam's (1):
    its bias corrections use step ``steps + 1`` (``torch/optim/adam.py``: ``bias_correction1 = 1 - beta1 ** step``)."""
    beta1, beta2 = betas
    step = steps + 1
    return (1 - beta1) / (1 - beta1**step) * math.sqrt((1 - beta2**step) / (1 - beta2))


@exercise
def check_mixed_reload(reload: Callable[[str, Any, dict[str, Any]], Any], launch: Launch | None = None) -> None:
    """`reload(path, config, per_table)`, run on every rank, must return an AppState sharded by `per_table` (here
    ``mixed_layout()``: two tables stay fused, two become data-parallel and move to Adam) that holds everything of
    the checkpoint that still means something: every weight, the step, the Adagrad state of the tables that stay
    fused, Adam's state of the dense part; and, for the tables that moved to Adam, a fresh Adam state: zero
    moments and no step counted, or no state at all (the checkpoint has none to give, and an Adagrad accumulator is
    not one). The check then asks for a second layout,
    with other tables moving, of a second checkpoint (other table sizes, another step), and wants the same of it;
    the answer may change neither its arguments nor the checkpoints."""
    references, results = _reloads(_launch(launch), reload, _mixed_on_rank, 2, "reload on 2 ranks")
    for index, report in enumerate(results[0]):
        stay, become = _MIXED_LAYOUTS[index]
        _judge_mixed(report, references[index]["state"], stay, become, other=index > 0, saved_at=_CASES[index][1])
    passed("reload keeps every weight, the step, t_user's and t_item's Adagrad state and the dense part's Adam "
           "state, and starts Adam afresh for the two tables that left the fused kernel")
