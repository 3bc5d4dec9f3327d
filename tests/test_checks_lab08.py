"""The 08_checkpointing checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
import torch
from torch.distributed.checkpoint.stateful import Stateful

from course_lib.checks import CheckFailed, lab08

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------------ exercise 1


class AppState(Stateful):
    def __init__(self, model, optimizer, step=0):
        self.model, self.optimizer, self.step = model, optimizer, step

    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.step = state_dict["step"]


class ModelOnly(AppState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "step": self.step}

    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.step = state_dict["step"]


class OptimizerOnly(AppState):
    def state_dict(self):
        return {"optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state_dict):
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.step = state_dict["step"]


class FusedOptimizerOnly(AppState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.model.fused_optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.model.fused_optimizer.load_state_dict(state_dict["optimizer"])
        self.step = state_dict["step"]


class WithoutStep(AppState):
    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])


class HoldsObjects(AppState):
    def state_dict(self):
        return {"model": self.model, "optimizer": self.optimizer, "step": self.step}


class LoadsModelAndStepOnly(AppState):  # saves everything, gives the optimizer nothing back
    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.step = state_dict["step"]


class LoadsStepOnly(AppState):  # relies on dcp.load writing in place
    def load_state_dict(self, state_dict):
        self.step = state_dict["step"]


class LoadsFusedOptimizerOnly(AppState):  # the tables' optimizer gets the state, Adam does not
    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.model.fused_optimizer.load_state_dict(state_dict["optimizer"])
        self.step = state_dict["step"]


class RebindsInsteadOfLoading(AppState):  # replaces its attributes with the dicts: the model never sees them
    def load_state_dict(self, state_dict):
        self.model_state, self.optimizer_state = state_dict["model"], state_dict["optimizer"]
        self.step = state_dict["step"]


class StepReadButNotKept(AppState):  # reads the step into a local name
    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        step = state_dict["step"]  # noqa: F841


class SnapshotAtInit(AppState):  # the state dict made once, in __init__: a save writes the app as it was then
    def __init__(self, model, optimizer, step=0):
        super().__init__(model, optimizer, step)
        self._state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}

    def state_dict(self):
        return self._state


class PopsTheStep(AppState):  # restores everything, and takes the step out of the caller's dict
    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.step = state_dict.pop("step")


class SavesTheStepAsATensor(AppState):  # "DCP saves tensors": the step comes back as tensor(3)
    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": torch.tensor(self.step)}


class SavesTheStepAsAFloat(AppState):  # the step comes back as 3.0
    def state_dict(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": float(self.step)}


def test_app_state_check_accepts_the_solution(capsys):
    lab08.check_app_state(AppState)
    assert capsys.readouterr().out.startswith("✓")


class KeysOfItsOwn(AppState):  # "under keys of your choice": DMP prefixes the model's dict in place under any key
    def state_dict(self):
        return {"weights": self.model.state_dict(), "optim": self.optimizer.state_dict(), "global_step": self.step}

    def load_state_dict(self, state_dict):
        self.model.load_state_dict(state_dict["weights"])
        self.optimizer.load_state_dict(state_dict["optim"])
        self.step = state_dict["global_step"]


def test_app_state_check_accepts_keys_of_the_answers_choice(capsys):
    lab08.check_app_state(KeysOfItsOwn)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (ModelOnly, "neither the tables' Adagrad momentum nor Adam"),
        (OptimizerOnly, "the model's weights were not restored"),
        (FusedOptimizerOnly, "Adam's state for the dense part was not restored"),
        (WithoutStep, "the step was not restored"),
        (HoldsObjects, "raised"),
        (LoadsModelAndStepOnly, "does not restore the fused Adagrad state nor Adam's state"),
        (LoadsStepOnly, "does not restore the model's weights"),
        (LoadsFusedOptimizerOnly, "Different parameter count"),  # the combined state into the fused optimizer
        (RebindsInsteadOfLoading, "does not restore the model's weights"),
        (StepReadButNotKept, "the step was not restored"),
        (SnapshotAtInit, "the checkpoint says step 0, but dcp.save ran at step 3"),
        (PopsTheStep, "load_state_dict\\(\\) changed the state dict it was handed: the state dict lost its entry 'step'"),
        (SavesTheStepAsATensor, r"(?s)app.step is tensor\(3\) after loading a checkpoint taken at step 3, a Tensor, not "
                                r"an int: .*losses\[3\] is not found.*keep the step an int"),
        (SavesTheStepAsAFloat, r"app.step is 3.0 after loading a checkpoint taken at step 3, a float, not an int: "
                               r"the loop .*step_folder"),
    ],
)
def test_app_state_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab08.check_app_state(wrong)


# ------------------------------------------------------------------------------------------ exercise 2


def save(app, root, keep=2):  # the solution's
    import shutil
    from pathlib import Path

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    dist.barrier()
    if dist.get_rank() == 0:
        complete = sorted(p for p in Path(root).glob("step_*") if (p / ".metadata").is_file())
        for old in complete[:-keep]:
            shutil.rmtree(old)
    return folder


def _complete(root):
    from pathlib import Path

    return sorted(p for p in Path(root).glob("step_*") if (p / ".metadata").is_file())


def save_then_prune_without_a_barrier(app, root, keep=2):  # accepted: dcp.save returns once the checkpoint is whole
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    if dist.get_rank() == 0:
        for old in _complete(root)[:-keep]:
            shutil.rmtree(old)
    return folder


def prune_before_save(app, root, keep=2):  # makes room first: a failed save leaves keep - 1
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    if dist.get_rank() == 0:
        for old in _complete(root)[:-(keep - 1) or None]:
            shutil.rmtree(old)
    dist.barrier()
    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    return folder


def every_rank_prunes(app, root, keep=2):  # ignore_errors hides the race, not the second deleter
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    dist.barrier()
    for old in _complete(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return folder


def keep_the_oldest(app, root, keep=2):
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    dist.barrier()
    if dist.get_rank() == 0:
        for old in _complete(root)[keep:]:
            shutil.rmtree(old)
    return folder


def keep_one_more(app, root, keep=2):  # "keep old ones besides the new one"
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    dist.barrier()
    if dist.get_rank() == 0:
        for old in _complete(root)[:-keep - 1]:
            shutil.rmtree(old)
    return folder


def keep_two_always(app, root, keep=2):  # the lab's default typed in
    return save(app, root, 2)


def save_without_keep(app, root):  # exercise 2's first version: no keep at all
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    return folder


def swallow_a_failed_save(app, root, keep=2):  # "a save must never crash the job"
    import shutil

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    try:
        dcp.save({"app": app}, checkpoint_id=folder)
    except BaseException:
        pass
    dist.barrier()
    if dist.get_rank() == 0:
        for old in _complete(root)[:-keep]:
            shutil.rmtree(old)
    return folder


def count_every_step_folder(app, root, keep=2):  # a failed save's folder counted as a checkpoint
    import shutil
    from pathlib import Path

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    dist.barrier()
    if dist.get_rank() == 0:
        for old in sorted(Path(root).glob("step_*"))[:-keep]:
            shutil.rmtree(old)
    return folder


def save_rank_zero_with_torch_save(app, root):
    import torch.distributed as dist

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    if dist.get_rank() == 0:
        os.makedirs(folder, exist_ok=True)
        torch.save(app.model.state_dict(), os.path.join(folder, "model.pt"))
    return folder


def save_the_model_only(app, root):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"model": app.model.state_dict()}, checkpoint_id=folder)
    return folder


def save_on_rank_zero_only(app, root):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    if dist.get_rank() == 0:  # as with torch.save; but dcp.save is a collective: rank 0 waits for rank 1
        dcp.save({"app": app}, checkpoint_id=folder)
    return folder


def save_on_rank_zero_without_a_group(app, root):  # no hang, but rank 1's shards are never written
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    if dist.get_rank() == 0:
        dcp.save({"app": app}, checkpoint_id=folder, no_dist=True)
    return folder


def save_into_root(app, root):
    import torch.distributed.checkpoint as dcp

    dcp.save({"app": app}, checkpoint_id=root)
    return root


def save_without_the_step(app, root):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": {"model": app.model.state_dict(), "optimizer": app.optimizer.state_dict()}}, checkpoint_id=folder)
    return folder


def save_under_another_key(app, root):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"state": app}, checkpoint_id=folder)
    return folder


def save_the_fused_optimizer_only(app, root):  # the tables' Adagrad, not Adam's state
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    state = {"model": app.model.state_dict(), "optimizer": app.model.fused_optimizer.state_dict(), "step": app.step}
    dcp.save({"app": state}, checkpoint_id=folder)
    return folder


def save_stepping_the_optimizer_first(app, root):  # "makes the lazy state exist": the last gradients, again
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    app.optimizer.step()
    dcp.save({"app": app}, checkpoint_id=folder)
    return folder


def save_then_free_the_model(app, root):  # the job is not over: it trains on from this model
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    app.model.module.model.dense_arch.to("meta")  # (app.model.to("meta") raises on a DMP model)
    return folder


def save_counting_the_next_step(app, root):  # moves the step on, as if saving were a step
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    folder = os.path.join(root, checkpoint.step_folder(app.step))
    dcp.save({"app": app}, checkpoint_id=folder)
    app.step += 1
    return folder


def save_into_the_folder_the_check_shows(app, root):  # the ✓ line's step_000003 typed in: right at step 3 only
    import torch.distributed.checkpoint as dcp

    folder = os.path.join(root, "step_000003")
    dcp.save({"app": app}, checkpoint_id=folder)
    return folder


def test_save_check_accepts_the_solution(capsys):
    lab08.check_save(save)
    assert capsys.readouterr().out.startswith("✓")


def test_save_check_accepts_pruning_without_a_barrier(capsys):
    lab08.check_save(save_then_prune_without_a_barrier)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (prune_before_save, r"step 10; afterwards the complete checkpoints are \[step_000008, step_000009\], expected "
                            r"\[step_000007, step_000008, step_000009\] still there"),
        (every_rank_prunes, r"ranks \[0, 1\] all delete old checkpoints"),
        (keep_the_oldest, "expected the newest 3, .*step_000007, step_000008, step_000009.*\n.*not the oldest"),
        (keep_one_more, "are \\[step_000006, step_000007, step_000008, step_000009\\]; .*\n.*counting the one just written"),
        (keep_two_always, "are \\[step_000008, step_000009\\]; expected the newest 3"),
        (save_without_keep, "keep as its third argument"),
        (swallow_a_failed_save, "save returned normally on rank\\(s\\) \\[0, 1\\]"),
        (count_every_step_folder, "without DCP's .metadata: it is not a checkpoint"),
    ],
)
def test_save_check_refuses_a_wrong_keep(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab08.check_save(wrong)


def test_save_check_refuses_a_deletion_before_the_new_checkpoint_is_complete():
    # the backstop behind the failure injection: every list right, but rank 0 removed a folder mid-save
    good = {"kept": [7, 8, 9], "failed save raised": True, "after failure": [7, 8, 9], "after recovery": [8, 9, 11]}
    early = {"call": "rmtree", "path": "/tmp/x/step_000006", "new one complete": False}
    reports = [{"default kept": [3, 5], "keep": {**good, "deletions": [early]}},
               {"default kept": [3, 5], "keep": {**good, "deletions": []}}]
    with pytest.raises(CheckFailed, match="deleted step_000006 before the checkpoint it was writing was complete"):
        lab08._judge_keep(reports)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (save_rank_zero_with_torch_save, "no DCP checkpoint under root"),
        (save_the_model_only, "holds no optimizer state"),
        (save_into_root, "not into a step folder"),
        (save_without_the_step, "Missing key .*app.step"),
        (save_under_another_key, "(?s)cannot be loaded as .*under the key 'app'"),
        (save_the_fused_optimizer_only, "cannot be loaded as .*Missing key .*exp_avg|cannot be loaded as .*Missing key"),
        (save_on_rank_zero_without_a_group, "only rank 0 wrote its shards"),
        (save_stepping_the_optimizer_first, "save changed the app it was handed: the model's weights, Adam's state"),
        (save_then_free_the_model, "save changed the app it was handed: the model and optimizer can no longer be read .* after the call"),
        (save_counting_the_next_step, "save changed the app it was handed: the step \\(now 4\\)"),
        (save_into_the_folder_the_check_shows, "a second save\\(app, root\\), at step 5, returned .*step_000003.*does "
                                               "not follow app.step"),
    ],
)
def test_save_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab08.check_save(wrong)


def test_save_check_turns_a_hang_into_a_verdict(monkeypatch):
    monkeypatch.setattr(lab08, "_TIMEOUT", 20.0)  # the check's bound, shortened: the hang is the point here
    with pytest.raises(CheckFailed, match="did not finish within 20 s") as failure:
        lab08.check_save(save_on_rank_zero_only)
    assert "collectives: call them on every rank" in failure.value.hint


# ------------------------------------------------------------------------------------------ exercise 3


def _sharded(config, per_table):
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel

    from course_lib import models, training

    torch.manual_seed(0)
    model = models.click_dlrm(config.tables(16), config.num_dense, device="meta")
    plan = training.model_plan(model, per_table, world_size=dist.get_world_size())
    return DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())


def reload(path, config, per_table):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _sharded(config, per_table)
    optimizer = training.optimizer(model)
    checkpoint.init_optimizer_state(optimizer)
    app = checkpoint.AppState(model, optimizer)
    dcp.load({"app": app}, checkpoint_id=path)
    return app


def reload_before_sharding(path, config, per_table):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torchrec.distributed import DistributedModelParallel

    from course_lib import checkpoint, models, training

    torch.manual_seed(0)
    model = models.click_dlrm(config.tables(16), config.num_dense)  # on the CPU, whole, on every rank
    state = {"app": {"model": model.state_dict()}}
    dcp.load(state, checkpoint_id=path)
    model.load_state_dict(state["app"]["model"])
    plan = training.model_plan(model, per_table, world_size=dist.get_world_size())
    model = DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())
    optimizer = training.optimizer(model)
    checkpoint.init_optimizer_state(optimizer)
    app = checkpoint.AppState(model, optimizer)
    dcp.load({"app": {"optimizer": optimizer.state_dict(), "step": 0}}, checkpoint_id=path)
    return app


def reload_ignoring_per_table(path, config, per_table):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torchrec.distributed.sharding_plan import table_wise

    from course_lib import checkpoint, training

    world_size = dist.get_world_size()  # sharded as the checkpoint was written, not as asked
    as_saved = {t.name: table_wise(rank=i % world_size, compute_kernel="fused") for i, t in enumerate(config.tables(16))}
    model = _sharded(config, as_saved)
    optimizer = training.optimizer(model)
    checkpoint.init_optimizer_state(optimizer)
    app = checkpoint.AppState(model, optimizer)
    dcp.load({"app": app}, checkpoint_id=path)
    return app


def reload_without_initialising_adam(path, config, per_table):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _sharded(config, per_table)
    app = checkpoint.AppState(model, training.optimizer(model))
    dcp.load({"app": app}, checkpoint_id=path)
    return app


def reload_the_model_only(path, config, per_table):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _sharded(config, per_table)
    state = {"app": {"model": model.state_dict(), "step": 0}}
    dcp.load(state, checkpoint_id=path)
    app = checkpoint.AppState(model, training.optimizer(model), state["app"]["step"])
    return app


def reload_without_the_step(path, config, per_table):  # model and optimizer back, the step left at 0
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _sharded(config, per_table)
    optimizer = training.optimizer(model)
    checkpoint.init_optimizer_state(optimizer)
    dcp.load({"app": {"model": model.state_dict(), "optimizer": optimizer.state_dict()}}, checkpoint_id=path)
    return checkpoint.AppState(model, optimizer)


def reload_initialising_adam_after_the_load(path, config, per_table):  # the zero step overwrites what was loaded
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint, training

    model = _sharded(config, per_table)
    optimizer = training.optimizer(model)
    app = checkpoint.AppState(model, optimizer)
    dcp.load({"app": app}, checkpoint_id=path)
    checkpoint.init_optimizer_state(optimizer)
    return app


def reload_the_lab_config(path, config, per_table):  # the lab's log.config: right only at the lab's sizes
    from course_lib import data

    return reload(path, data.ClickLogConfig(num_train=40_000, num_test=2_000), per_table)


def reload_row_wise_always(path, config, per_table):  # the lab's layout("row_wise", ...), not the plan it is given
    from torchrec.distributed.sharding_plan import row_wise

    return reload(path, config, {t.name: row_wise(compute_kernel="fused") for t in config.tables(16)})


_PATHS_SEEN = []


def reload_the_first_path(path, config, per_table):  # a fixed checkpoint (here: the first one it was given)
    _PATHS_SEEN.append(path)
    return reload(_PATHS_SEEN[0], config, per_table)


def reload_the_first_path_and_the_lab_config(path, config, per_table):
    from course_lib import data

    _PATHS_SEEN.append(path)
    return reload(_PATHS_SEEN[0], data.ClickLogConfig(num_train=40_000, num_test=2_000), per_table)


def reload_that_edits_the_plan(path, config, per_table):  # "fills in" the kernel in the caller's plan
    from torchrec.distributed.sharding_plan import row_wise

    for name in per_table:
        per_table[name] = row_wise(compute_kernel="fused")
    return reload(path, config, per_table)


def reload_and_rewrite_the_checkpoint(path, config, per_table):  # "converts" the checkpoint to the new layout
    import torch.distributed.checkpoint as dcp

    app = reload(path, config, per_table)
    dcp.save({"app": app}, checkpoint_id=path)
    return app


def reload_with_a_tensor_step(path, config, per_table):  # everything restored, the step handed back as a tensor
    app = reload(path, config, per_table)
    app.step = torch.tensor(app.step)
    return app


def test_reload_check_accepts_the_solution(capsys):
    lab08.check_reload(reload)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (reload_before_sharding, "tables were not restored, its dense part was"),
        (reload_ignoring_per_table, "tables are \\['table_wise'\\], the plan asks for row_wise"),
        (reload_without_initialising_adam, "Adam's state was not restored"),
        (reload_the_model_only, "the optimizer's state was not restored"),
        (reload_without_the_step, "the reloaded step is 0"),
        (reload_initialising_adam_after_the_load, "Adam's state was not restored"),
        (reload_the_lab_config, "built its tables from a config other than the one it was handed"),
        (reload_row_wise_always, "with a second checkpoint .*reload does not shard by its per_table argument"),
        (reload_the_first_path, "read a checkpoint other than the path it was handed"),
        (reload_the_first_path_and_the_lab_config, "returned step 3, the step of the first checkpoint"),
        (reload_that_edits_the_plan, "reload changed its argument 3 \\(per_table\\) in place"),
        (reload_and_rewrite_the_checkpoint, "reload wrote into the checkpoint it was handed"),
        (reload_with_a_tensor_step, r"app.step is tensor\(3\) after reload, a Tensor, not an int"),
    ],
)
def test_reload_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab08.check_reload(wrong, world_size=2)


# ------------------------------------------------------------------------------------------ exercise 4


def _mixed_app(path, config, per_table, init=True):
    from course_lib import checkpoint, training

    model = _sharded(config, per_table)
    optimizer = training.optimizer(model)
    if init:
        checkpoint.init_optimizer_state(optimizer)
    return model, optimizer


def mixed_keeping_the_init_step(path, config, per_table):  # asks for what the checkpoint has; the moved tables keep
    import torch.distributed.checkpoint as dcp                 # the step init_optimizer_state counted

    from course_lib import checkpoint

    model, optimizer = _mixed_app(path, config, per_table)
    saved = set(checkpoint.contents(path).index)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}
    state["optimizer"] = {"state": {param: values for param, values in state["optimizer"]["state"].items()
                                    if all(f"app.optimizer.state.{param}.{name}" in saved for name in values)}}
    dcp.load({"app": state}, checkpoint_id=path)
    return checkpoint.AppState(model, optimizer, state["step"])


def reload_mixed(path, config, per_table):  # the lab's solution: ask for what the checkpoint has, start the rest afresh
    app = mixed_keeping_the_init_step(path, config, per_table)
    saved = set(__import__("course_lib").checkpoint.contents(path).index)
    for param, values in app.optimizer.state_dict()["state"].items():
        if "step" in values and f"app.optimizer.state.{param}.step" not in saved:
            values["step"].zero_()  # zero moments and no step counted: a new Adam
    return app


def mixed_dropping_the_moved_state(path, config, per_table):  # no state at all: Adam makes it at the first step
    from course_lib import checkpoint

    app = mixed_keeping_the_init_step(path, config, per_table)
    saved = set(checkpoint.contents(path).index)
    names = {id(p): name for name, p in app.model.named_parameters()}
    for inner in checkpoint._torch_optimizers(app.optimizer):
        for param in [p for p in inner.state if f"app.optimizer.state.model.{names.get(id(p))}.step" not in saved
                      and f"app.optimizer.state.{names.get(id(p))}.step" not in saved]:
            del inner.state[param]
    return app


def mixed_load_everything(path, config, per_table):  # the whole new app state: Adam keys the checkpoint lacks
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    model, optimizer = _mixed_app(path, config, per_table)
    app = checkpoint.AppState(model, optimizer)
    dcp.load({"app": app}, checkpoint_id=path)
    return app


def mixed_weights_and_step_only(path, config, per_table):  # section 7's fix, applied where it throws state away
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    model, optimizer = _mixed_app(path, config, per_table)
    state = {"model": model.state_dict(), "step": 0}
    dcp.load({"app": state}, checkpoint_id=path)
    return checkpoint.AppState(model, optimizer, state["step"])


def mixed_weights_only(path, config, per_table):
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    model, optimizer = _mixed_app(path, config, per_table)
    dcp.load({"app": {"model": model.state_dict()}}, checkpoint_id=path)
    return checkpoint.AppState(model, optimizer, 3)


def mixed_without_initialising_adam(path, config, per_table):  # the filter keeps only what exists: no Adam yet
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    model, optimizer = _mixed_app(path, config, per_table, init=False)
    saved = set(checkpoint.contents(path).index)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}
    state["optimizer"] = {"state": {p: v for p, v in state["optimizer"]["state"].items()
                                    if all(f"app.optimizer.state.{p}.{n}" in saved for n in v)}}
    dcp.load({"app": state}, checkpoint_id=path)
    return checkpoint.AppState(model, optimizer, state["step"])


def mixed_adagrad_into_adam(path, config, per_table):  # "translates" the accumulator into Adam's second moment
    import torch.distributed.checkpoint as dcp

    app = reload_mixed(path, config, per_table)
    state = app.optimizer.state_dict()["state"]
    for table in ("t_category", "t_terms"):
        key = f"model.sparse_arch.embedding_bag_collection.embedding_bags.{table}.weight"
        donor = {"momentum": torch.zeros_like(state[key]["exp_avg_sq"])}
        dcp.load({"app": {"optimizer": {"state": {key: {f"{table}.momentum1": donor["momentum"]}}}}}, checkpoint_id=path)
        state[key]["exp_avg_sq"].copy_(donor["momentum"])
    return app


def mixed_as_saved(path, config, per_table):  # ignores the layout it was given
    import torch.distributed as dist

    return reload(path, config, {t.name: __import__("torchrec.distributed.sharding_plan", fromlist=["table_wise"])
                                 .table_wise(rank=i % dist.get_world_size(), compute_kernel="fused")
                                 for i, t in enumerate(config.tables(16))})


def mixed_names_the_tables(path, config, per_table):  # skips the tables that move in mixed_layout(), by name
    import torch.distributed.checkpoint as dcp

    from course_lib import checkpoint

    model, optimizer = _mixed_app(path, config, per_table)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": 0}
    state["optimizer"] = {"state": {p: v for p, v in state["optimizer"]["state"].items()
                                    if "t_category" not in p and "t_terms" not in p}}
    dcp.load({"app": state}, checkpoint_id=path)
    for p, values in optimizer.state_dict()["state"].items():  # and starts those two afresh, by name too
        if ("t_category" in p or "t_terms" in p) and "step" in values:
            values["step"].zero_()
    return checkpoint.AppState(model, optimizer, state["step"])


def mixed_into_the_lab_config(path, config, per_table):  # the lab's log.config: right only at the lab's sizes
    from course_lib import data

    return reload_mixed(path, data.ClickLogConfig(num_train=40_000, num_test=2_000), per_table)


def mixed_that_rewrites_the_checkpoint(path, config, per_table):  # saves the new layout over the old checkpoint
    import torch.distributed.checkpoint as dcp

    app = reload_mixed(path, config, per_table)
    dcp.save({"app": app}, checkpoint_id=path)
    return app


def mixed_that_edits_the_plan(path, config, per_table):  # replaces the data-parallel entries of the caller's plan
    from torchrec.distributed.sharding_plan import data_parallel

    for name in ("t_category", "t_terms"):  # data-parallel in mixed_layout(): "made sure of" in place
        per_table[name] = data_parallel()
    return reload_mixed(path, config, per_table)


def mixed_with_a_float_step(path, config, per_table):  # everything restored, the step handed back as a float
    app = reload_mixed(path, config, per_table)
    app.step = float(app.step)
    return app


def test_mixed_reload_check_accepts_the_solution(capsys):
    lab08.check_mixed_reload(reload_mixed)
    assert capsys.readouterr().out.startswith("✓")


def test_mixed_reload_check_accepts_moved_tables_with_no_state(capsys):
    lab08.check_mixed_reload(mixed_dropping_the_moved_state)
    assert capsys.readouterr().out.startswith("✓")


def test_mixed_reload_check_rejects_an_adam_state_that_counted_a_step():
    # init_optimizer_state's step 1: the moved tables' first update is 0.744 of a new Adam's (bias correction at step 2)
    with pytest.raises(CheckFailed, match="has zero moments but has counted 1 step already: their first update will "
                                          "be 26% smaller than a new Adam's") as failure:
        lab08.check_mixed_reload(mixed_keeping_the_init_step)
    assert "set that step back to 0 after the load" in str(failure.value)


def test_first_update_ratio_is_adams():
    param = torch.nn.Parameter(torch.zeros(3))
    adam = torch.optim.Adam([param], lr=0.1)
    param.grad = torch.tensor([1.0, -2.0, 0.5])
    adam.step()  # a new Adam: the first update is lr * sign(grad)
    fresh = param.detach().abs().clone()
    counted = torch.nn.Parameter(torch.zeros(3))
    late = torch.optim.Adam([counted], lr=0.1)
    late.state[counted] = {"step": torch.tensor(1.0), "exp_avg": torch.zeros(3), "exp_avg_sq": torch.zeros(3)}
    counted.grad = param.grad.clone()
    late.step()
    assert torch.allclose(counted.detach().abs() / fresh, torch.full((3,), lab08._first_update_ratio(1)), rtol=1e-4)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (mixed_load_everything, "(?s)Missing key.*decide which parts"),
        (mixed_weights_and_step_only, "Adagrad state of t_user and t_item"),
        (mixed_weights_only, "Adagrad state of t_user and t_item"),
        (mixed_without_initialising_adam, "Adam's state of the dense part"),
        (mixed_adagrad_into_adam, "not a fresh one"),
        (mixed_as_saved, "the layout asks for"),
        (mixed_names_the_tables, "(?s)with another layout .*decide from per_table"),
        (mixed_into_the_lab_config, "built its tables from a config other than the one it was handed"),
        (mixed_that_rewrites_the_checkpoint, "reload wrote into the checkpoint it was handed"),
        (mixed_that_edits_the_plan, "reload changed its argument 3 \\(per_table\\) in place"),
        (mixed_with_a_float_step, r"app.step is 3.0 after reload, a float, not an int"),
    ],
)
def test_mixed_reload_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab08.check_mixed_reload(wrong)
