"""course_lib.checkpoint: the app state, lazy optimizer state, step folders, data by step, whole tensors."""
from __future__ import annotations

import os
import sys

import cloudpickle
import pytest
import torch

from course_lib import checkpoint, data, launch

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONFIG = data.ClickLogConfig(num_train=2_000, num_test=200, seed=1)


def test_step_folders_sort_by_step_and_latest_skips_incomplete_saves(tmp_path):
    assert checkpoint.step_folder(40) == "step_000040"
    assert checkpoint.latest(tmp_path / "missing") is None
    assert checkpoint.latest(tmp_path) is None
    for step in (5, 10, 100):
        (tmp_path / checkpoint.step_folder(step)).mkdir()
        (tmp_path / checkpoint.step_folder(step) / ".metadata").write_bytes(b"")
    (tmp_path / checkpoint.step_folder(200)).mkdir()  # a save cut short: no .metadata
    assert checkpoint.latest(tmp_path) == tmp_path / "step_000100"


def test_batch_at_is_the_step_th_batch_of_data_batches_and_wraps_around():
    split = data.make_click_log(CONFIG).train
    for rank in (0, 1):
        expected = list(data.batches(split, 100, rank, 2))
        assert len(expected) == 10
        for step in (0, 3, 9):
            got = checkpoint.batch_at(split, step, 100, rank, 2)
            assert torch.equal(got.labels, expected[step].labels)
            assert torch.equal(got.dense_features, expected[step].dense_features)
        assert torch.equal(checkpoint.batch_at(split, 13, 100, rank, 2).labels, expected[3].labels)
    assert torch.equal(checkpoint.batch_at(split, 2, 100).labels, split.labels[200:300])  # no group: one rank
    with pytest.raises(ValueError, match="fewer than one step"):
        checkpoint.batch_at(split.rows(0, 50), 0, 100)


def test_init_optimizer_state_creates_adam_state_without_moving_a_weight():
    from course_lib import models, training

    torch.manual_seed(0)
    model = models.click_dlrm(CONFIG.tables(8), CONFIG.num_dense, hidden=8)
    optimizer = training.optimizer(model)  # a KeyedOptimizerWrapper around Adam
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert not optimizer.state_dict()["state"]
    checkpoint.init_optimizer_state(optimizer)
    state = optimizer.state_dict()["state"]
    assert set(state) == {name for name, _ in model.named_parameters()}
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    assert optimizer.param_groups[0]["lr"] == training.DEFAULT_DENSE_LR
    plain = torch.optim.Adam([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    checkpoint.init_optimizer_state(plain)
    assert set(plain.state[plain.param_groups[0]["params"][0]]) == {"step", "exp_avg", "exp_avg_sq"}


def _round_trip(folder: str) -> dict:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import table_wise

    from course_lib import models, training

    def build():
        torch.manual_seed(0)
        model = models.click_dlrm(CONFIG.tables(8), CONFIG.num_dense, hidden=8, device="meta")
        per_table = {t.name: table_wise(rank=i % 2, compute_kernel="fused") for i, t in enumerate(CONFIG.tables(8))}
        plan = training.model_plan(model, per_table, world_size=2)
        dmp = DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())
        return dmp, training.optimizer(dmp)

    split = data.make_click_log(CONFIG).train
    model, optimizer = build()
    for step in range(2):
        training.train_step(model, optimizer, checkpoint.batch_at(split, step, 50))
    saved = checkpoint.full_tensors({"model": model.state_dict(), "optimizer": optimizer.state_dict()})
    dcp.save({"app": checkpoint.AppState(model, optimizer, 2)}, checkpoint_id=folder)
    fresh, fresh_optimizer = build()
    checkpoint.init_optimizer_state(fresh_optimizer)
    app = checkpoint.AppState(fresh, fresh_optimizer)
    dcp.load({"app": app}, checkpoint_id=folder)
    loaded = checkpoint.full_tensors({"model": fresh.state_dict(), "optimizer": fresh_optimizer.state_dict()})
    table = model.state_dict()["model.sparse_arch.embedding_bag_collection.embedding_bags.t_user.weight"]
    return {"saved": saved, "loaded": loaded, "step": app.step, "rank": dist.get_rank(),
            "local_user_rows": [tuple(s.tensor.shape) for s in table.local_shards()]}


def test_app_state_round_trip_on_two_ranks_and_what_the_checkpoint_holds(tmp_path):
    folder = str(tmp_path / checkpoint.step_folder(2))
    rank0, rank1 = launch(_round_trip, folder, world_size=2, show_ranks=[])
    assert rank0["local_user_rows"] == [(500, 8)] and rank1["local_user_rows"] == []  # t_user lives on rank 0
    assert rank0["step"] == rank1["step"] == 2
    saved, loaded = rank0["saved"], rank0["loaded"]
    assert sorted(saved) == sorted(rank1["saved"]) == sorted(loaded)  # every rank sees every key, whole
    momentum = [k for k in saved if k.endswith("momentum1")]
    assert len(momentum) == 4 and all(saved[k].shape == (n, 8) for k, n in zip(sorted(momentum), (20, 200, 50, 500)))
    assert all(torch.equal(saved[k], loaded[k]) and torch.equal(saved[k], rank1["saved"][k]) for k in saved)
    assert saved[momentum[0]].abs().sum() > 0  # trained: not a trivially equal zero state

    contents = checkpoint.contents(folder)
    assert "app.step" in contents.index and contents.loc["app.step", "kind"] == "object"
    user = "app.model.model.sparse_arch.embedding_bag_collection.embedding_bags.t_user.weight"
    assert contents.loc[user, "global shape"] == (500, 8) and contents.loc[user, "bytes"] == 500 * 8 * 4
    files = checkpoint.sizes(folder)
    assert set(files) == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    assert sum(files.values()) == sum(os.path.getsize(os.path.join(folder, f)) for f in files)
