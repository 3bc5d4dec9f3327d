"""Checks for 08_checkpointing: an app state to checkpoint, the save call, a reload into a new world size.

Each check runs the learner's code on several ranks with the lab's DLRM (table-wise, fused Adagrad
tables + Adam for the dense part), in a temporary folder that is removed afterwards, and compares whole
tensors (``course_lib.checkpoint.full_tensors``): weights, the fused optimizer's state, Adam's state.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Callable

import torch

from course_lib import data
from course_lib.checks import exercise, fail, one_line, passed, raise_if_unwritten

# A small world for the checks: the lab's tables, few rows (fast to make and to train on).
_CHECK_CONFIG = data.ClickLogConfig(num_train=4_000, num_test=500, seed=3)
_BATCH = 32
_SAVED_AT = 3  # the checks save after this many steps
_ROWS = 240  # the fixed batch whose predictions are compared (divisible by 1, 2, 3, 4 ranks)
_TIMEOUT = 60.0  # seconds a check's launch may take (a few, normally): past it, a rank waits for peers that never come

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


def _table_wise(world_size: int, kernel: str = "fused") -> dict[str, Any]:
    from torchrec.distributed.sharding_plan import table_wise

    return {t.name: table_wise(rank=i % world_size, compute_kernel=kernel) for i, t in enumerate(_CHECK_CONFIG.tables(16))}


def _row_wise() -> dict[str, Any]:
    from torchrec.distributed.sharding_plan import row_wise

    return {t.name: row_wise(compute_kernel="fused") for t in _CHECK_CONFIG.tables(16)}


def _shard(per_table: dict[str, Any] | None = None) -> Any:
    """The lab's DLRM, built on meta and sharded by `per_table` (default: table-wise) on this group."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel

    from course_lib import models, training

    torch.manual_seed(0)
    model = models.click_dlrm(_CHECK_CONFIG.tables(16), _CHECK_CONFIG.num_dense, device="meta")
    world_size = dist.get_world_size()
    plan = training.model_plan(model, per_table or _table_wise(world_size), world_size=world_size)
    return DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())


def _train(model: Any, optimizer: Any, steps: range) -> None:
    from course_lib import checkpoint, training

    split = data.make_click_log(_CHECK_CONFIG).train
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


def _predict(model: Any) -> torch.Tensor:
    from course_lib import training

    logits, _ = training.predict(model, data.make_click_log(_CHECK_CONFIG).test.rows(0, _ROWS))
    return logits


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
        fresh.load_state_dict(state["app"])
    except _ERRORS as error:
        report["fresh_error"] = _first_line(error)
        return report
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
    if report["fresh_step"] != _SAVED_AT:
        fail(f"load_state_dict() leaves the step at {report['fresh_step']}, the state dict says {_SAVED_AT}",
             "set self.step from the state dict in load_state_dict()")
    passed("AppState restores the weights, the fused Adagrad state, Adam's state and the step, in place (dcp.load) "
           "and through load_state_dict() alone")


# ------------------------------------------------------------------------------------------ exercise 2


def _save_on_rank(save: Callable[[Any, str], Any], root: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _shard()
    optimizer = training.optimizer(model)
    _train(model, optimizer, range(_SAVED_AT))
    saved = _state(model, optimizer)
    report: dict[str, Any] = {}
    try:
        returned = save(checkpoint.AppState(model, optimizer, _SAVED_AT), root)
    except _ERRORS as error:
        raise_if_unwritten(error)
        report["error"] = f"save(app, root) raised {_first_line(error)}"
        return report
    import torch.distributed as dist

    dist.barrier()
    report["returned"] = None if returned is None else os.fspath(returned)
    report["files"] = sorted(str(p.relative_to(root)) for p in Path(root).rglob("*") if p.is_file())
    folder = checkpoint.latest(root)
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
    return report


@exercise
def check_save(save: Callable[[Any, str], Any], launch: Launch | None = None) -> None:
    """`save(app, root)` must write a DCP checkpoint of `app` (every rank its shards) into
    ``root / checkpoint.step_folder(app.step)`` and return that folder.

    The check trains 3 steps on 2 ranks, calls `save`, then loads the newest checkpoint under `root` into a
    freshly sharded model and optimizer and compares every tensor and the step.
    """
    from course_lib import checkpoint

    root = tempfile.mkdtemp(prefix="lab08-check-")
    try:
        report = _on_ranks(_launch(launch), _save_on_rank, save, root, world_size=2, what="save(app, root)")[0]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if "error" in report:
        fail(report["error"])
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
    passed(f"save writes a DCP checkpoint into {checkpoint.step_folder(_SAVED_AT)}/ that restores everything")


# ------------------------------------------------------------------------------------------ exercise 3

def _reference_on_rank(folder: str) -> dict[str, Any]:
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _shard()
    optimizer = training.optimizer(model)
    _train(model, optimizer, range(_SAVED_AT))
    dcp.save({"app": checkpoint.AppState(model, optimizer, _SAVED_AT)}, checkpoint_id=folder)
    return {"state": _state(model, optimizer), "logits": _predict(model)}


def _reload_on_rank(reload: Callable[[str, Any, dict[str, Any]], Any], folder: str) -> dict[str, Any]:
    from course_lib import training

    try:
        app = reload(folder, _CHECK_CONFIG, _row_wise())
        model, optimizer, step = app.model, app.optimizer, app.step
    except _ERRORS as error:
        raise_if_unwritten(error)
        return {"error": _first_line(error)}
    return {
        "sharding": training.sharding_types(model),
        "state": _state(model, optimizer),
        "logits": _predict(model),
        "step": step,
    }


@exercise
def check_reload(reload: Callable[[str, Any, dict[str, Any]], Any], world_size: int = 4, launch: Launch | None = None) -> None:
    """`reload(path, config, per_table)`, run on every rank, must return an AppState whose model is sharded by
    `per_table` on this world size and holds the checkpoint's weights, optimizer state and step.

    The check saves a checkpoint on 2 ranks (every table table-wise), then runs `reload` on `world_size`
    ranks with every table row-wise, and compares predictions on a fixed batch and every tensor.
    """
    launch = _launch(launch)
    folder = tempfile.mkdtemp(prefix="lab08-check-")
    try:
        saved = _on_ranks(launch, _reference_on_rank, folder, world_size=2, what="saving the reference checkpoint")
        reference = {"state": saved[0]["state"], "logits": torch.cat([r["logits"] for r in saved])}
        with warnings.catch_warnings():  # launch notes that 4 ranks take turns on a 2-core laptop: known here
            warnings.filterwarnings("ignore", message="launch: .* ranks on .* CPU cores", category=UserWarning)
            results = _on_ranks(launch, _reload_on_rank, reload, folder, world_size=world_size,
                                what=f"reload on {world_size} ranks")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    report = results[0]
    if "error" in report:
        fail(f"reload raised {report['error']}", "see the cells above: shard, build the optimizer, then dcp.load")
    kinds = {kind for kind, _ in report["sharding"].values()}
    if kinds != {"row_wise"}:
        fail(
            f"the reloaded model's tables are {sorted(kinds) or 'not sharded'}, the plan asks for row_wise",
            "shard with the plan made from per_table for this world size: training.model_plan(model, per_table, ...)",
        )
    logits = torch.cat([r["logits"] for r in results])
    prediction_gap = (logits - reference["logits"]).abs().max().item()
    differences = _differences(report["state"], reference["state"])
    if differences["model"] > 1e-6:
        dense_equal = all(
            torch.equal(report["state"].get(k, torch.empty(0)), v)
            for k, v in reference["state"].items()
            if k.startswith("model.") and "embedding_bags" not in k
        )
        fail(
            f"the reloaded model predicts differently (by up to {prediction_gap:.3g}): its "
            + ("tables were not restored, its dense part was" if dense_equal else "weights were not restored"),
            "load after sharding: DistributedModelParallel builds new tables when it shards a model, so weights "
            "loaded into the unsharded model are lost (and every rank would hold every table)"
            if dense_equal
            else "dcp.load the checkpoint into the sharded model's AppState",
        )
    if differences["fused"] > 0 and differences["adam"] > 0:
        fail(
            "the optimizer's state was not restored",
            "load the whole AppState (model and optimizer) after building the optimizer of the sharded model",
        )
    if differences["adam"] > 0:
        fail(
            f"Adam's state was not restored (off by {differences['adam']:.3g}), though no error was raised",
            "a fresh Adam has no state to load into: call checkpoint.init_optimizer_state(optimizer) before dcp.load",
        )
    if differences["fused"] > 0:
        fail(f"the fused optimizer's state was not restored (off by {differences['fused']:.3g})", "load the optimizer too")
    if report["step"] != _SAVED_AT:
        fail(f"the reloaded step is {report['step']}, the checkpoint was taken at step {_SAVED_AT}", "return the AppState you loaded into")
    passed(
        f"reload on {world_size} ranks (row-wise) restores a 2-rank table-wise checkpoint: predictions within "
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


def _mixed_on_rank(reload: Callable[[str, Any, dict[str, Any]], Any], folder: str,
                   layouts: list[tuple[str, ...]]) -> list[dict[str, Any]]:
    """On each rank: the learner's reload into each layout (given by its fused tables), what it holds."""
    from course_lib import checkpoint, training

    reports = []
    for stay_fused in layouts:
        per_table = mixed_layout() if stay_fused == _STAY_FUSED else _layout(stay_fused)
        fresh_model = _shard(per_table)  # what an optimizer that loaded nothing holds for the new Adam tables
        fresh_optimizer = training.optimizer(fresh_model)
        checkpoint.init_optimizer_state(fresh_optimizer)
        fresh = _state(fresh_model, fresh_optimizer)
        try:
            app = reload(folder, _CHECK_CONFIG, per_table)
            model, optimizer, step = app.model, app.optimizer, app.step
        except _ERRORS as error:
            raise_if_unwritten(error)
            reports.append({"error": _first_line(error)})
            break
        reports.append({"sharding": training.sharding_types(model), "state": _state(model, optimizer),
                        "fresh": fresh, "logits": _predict(model), "step": step})
    return reports


def _largest_difference(now: dict[str, torch.Tensor], want: dict[str, torch.Tensor], keys: list[str]) -> float:
    worst = 0.0
    for key in keys:
        other = now.get(key)
        worst = max(worst, float("inf") if other is None or other.shape != want[key].shape
                    else (other - want[key]).abs().max().item())
    return worst


def _judge_mixed(report: dict[str, Any], reference: dict[str, torch.Tensor], stay: tuple[str, ...],
                 become: tuple[str, ...], other: bool) -> None:
    """Fail with what is wrong with `report`, the learner's reload into the layout where `stay` stay fused and
    `become` become data-parallel; `other`: that layout is not the lab's mixed_layout()."""
    stay_names, become_names = " and ".join(stay), " and ".join(become)
    where = (f"with another layout ({become_names} data-parallel, {stay_names} fused), " if other else "")
    generic = ("; decide from per_table (or from what the checkpoint holds) which tables moved, not from the "
               "table names of mixed_layout()" if other else "")
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
    if report["step"] != _SAVED_AT:
        fail(f"{where}the reloaded step is {report['step']}, the checkpoint was taken at step {_SAVED_AT}",
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
    if not moved or _largest_difference(state, fresh, moved) > 0:
        fail(f"{where}the Adam state of {become_names} is not a fresh one: it was made up from something else",
             "an Adagrad accumulator is not Adam's moments: let the tables that moved to Adam start their optimizer "
             "from scratch" + generic)


@exercise
def check_mixed_reload(reload: Callable[[str, Any, dict[str, Any]], Any], launch: Launch | None = None) -> None:
    """`reload(path, config, per_table)`, run on every rank, must return an AppState sharded by `per_table` (here
    ``mixed_layout()``: two tables stay fused, two become data-parallel and move to Adam) that holds everything of
    the checkpoint that still means something: every weight, the step, the Adagrad state of the tables that stay
    fused, Adam's state of the dense part; and, for the tables that moved to Adam, a fresh Adam state (the
    checkpoint has none to give, and an Adagrad accumulator is not one). The check then asks for a second layout,
    with other tables moving, and wants the same of it."""
    launch = _launch(launch)
    folder = tempfile.mkdtemp(prefix="lab08-check-")
    layouts = [(_STAY_FUSED, _BECOME_DENSE), (_OTHER_STAY_FUSED, _OTHER_BECOME_DENSE)]
    try:
        saved = _on_ranks(launch, _reference_on_rank, folder, world_size=2, what="saving the reference checkpoint")
        results = _on_ranks(launch, _mixed_on_rank, reload, folder, [stay for stay, _ in layouts], world_size=2,
                            what="reload on 2 ranks")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    reference = saved[0]["state"]
    for index, report in enumerate(results[0]):
        stay, become = layouts[index]
        _judge_mixed(report, reference, stay, become, other=index > 0)
    passed("reload keeps every weight, the step, t_user's and t_item's Adagrad state and the dense part's Adam "
           "state, and starts Adam afresh for the two tables that left the fused kernel")
