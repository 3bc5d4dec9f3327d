"""course_lib.hybrid: TorchRec-sharded embeddings and an FSDP2-sharded dense tower in one DMP model."""
from __future__ import annotations

import pytest
import torch

from course_lib import data, hybrid, launch, models

CONFIG = data.ClickLogConfig(num_train=16_384, num_test=4_096)
STEPS = 12


def _log() -> data.ClickLog:
    return data.make_click_log(CONFIG)


def _report(config, rows, steps):
    """On each rank: a hybrid model and its optimizer; what they hold; losses of a few steps."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from course_lib import fsdp, hybrid, models, training
    from torchrec.distributed import DistributedModelParallel

    def build(wrapper):
        torch.manual_seed(0)
        model = models.click_dlrm(config.tables(16), config.num_dense, device="meta")
        if wrapper:
            return hybrid.shard_hybrid(model)
        return DistributedModelParallel(model, device=training.device(), plan=hybrid_plan, sharders=training.sharders())

    dmp = build(True)
    hybrid_plan = dmp.plan
    optimizer = hybrid.hybrid_optimizer(dmp)
    params = dict(dmp.named_parameters())
    inner = dmp._dmp_wrapped_module
    report = {
        "dense_modules": hybrid.dense_modules(dmp),
        "groups": fsdp.fsdp_groups(inner),
        "dtensors": {n: (str(p.placements), tuple(p.to_local().shape)) for n, p in params.items() if isinstance(p, DTensor)},
        "state_dict_types": {k: type(v).__name__ for k, v in dmp.state_dict().items()},
        "optimizer_keys": sorted(optimizer.params.keys()),
        "course_optimizer_keys": sorted(training.optimizer(dmp).params.keys()),
        "fused_keys": sorted(dmp.fused_optimizer.params.keys()),
    }
    report["losses"] = training.train(dmp, optimizer, rows, 512, max_steps=steps, desc=None)
    report["memory"] = {part: m.as_dict() for part, m in hybrid.memory_by_part(dmp, optimizer).items()}
    report["optimizer_state_keys"] = len(optimizer.state_dict()["state"])
    report["full_dense"] = {n: p.full_tensor() for n, p in dmp.named_parameters() if isinstance(p, DTensor)}
    ddp = build(False)
    ddp_optimizer = training.optimizer(ddp)
    report["ddp_losses"] = training.train(ddp, ddp_optimizer, rows, 512, max_steps=steps, desc=None)
    report["ddp_memory"] = {part: m.as_dict() for part, m in hybrid.memory_by_part(ddp, ddp_optimizer).items()}
    torch.manual_seed(0)
    unsynced = hybrid.shard_hybrid(models.click_dlrm(config.tables(16), config.num_dense, device="meta"),
                                   plan=hybrid_plan, wrapper=hybrid.FullyShardDense(sync_module_states=False))
    report["unsynced_first_loss"] = training.train(unsynced, hybrid.hybrid_optimizer(unsynced), rows, 512,
                                                   max_steps=1, desc=None)[0]
    report["world_size"] = dist.get_world_size()
    return report


@pytest.fixture(scope="module")
def reports():
    log = _log()
    return launch(_report, log.config, log.train, STEPS, world_size=2, show_ranks=[])


def test_dense_modules_of_an_unsharded_model_is_the_whole_model():
    model = models.click_dlrm(_log().tables(16), 4, device="meta")
    assert hybrid.dense_modules(model) == ["model"]


def test_dense_modules_are_the_dense_and_over_arch(reports):
    assert reports[0]["dense_modules"] == ["model.dense_arch", "model.over_arch"]


def test_every_dense_parameter_is_a_dtensor_sharded_on_rows(reports):
    dense = reports[0]["dtensors"]
    assert sorted(dense) == sorted(n for n in reports[0]["state_dict_types"] if "sparse_arch" not in n)
    assert {placements for placements, _ in dense.values()} == {"(Shard(dim=0),)"}
    # torch.chunk on dim 0: rank 0 holds the first half, the one-row head goes to rank 0 only
    assert dense["model.dense_arch.model._mlp.0._linear.weight"][1] == (16, 4)
    assert dense["model.over_arch.model.1.weight"][1] == (1, 32)
    assert reports[1]["dtensors"]["model.over_arch.model.1.weight"][1] == (0, 32)


def test_groups_are_each_perceptron_then_each_dense_module(reports):
    assert reports[0]["groups"] == [
        "model.dense_arch",
        "model.dense_arch.model._mlp.0",
        "model.dense_arch.model._mlp.1",
        "model.over_arch",
        "model.over_arch.model.0._mlp.0",
    ]


def test_embeddings_stay_sharded_tensors_and_dense_state_is_dtensor(reports):
    types = reports[0]["state_dict_types"]
    tables = {k: v for k, v in types.items() if "sparse_arch" in k}
    assert "ShardedTensor" in tables.values() and "DTensor" not in tables.values()
    assert {v for k, v in types.items() if "sparse_arch" not in k} == {"DTensor"}


def test_hybrid_optimizer_covers_everything_the_fused_one_does_not(reports):
    report = reports[0]
    keys = report["optimizer_keys"]  # the fused tables' and Adam's, combined
    assert keys == report["course_optimizer_keys"] and len(set(keys)) == len(keys)
    assert set(report["fused_keys"]) < set(keys)
    assert set(report["dtensors"]) < set(keys)
    assert report["optimizer_state_keys"] == len(keys)  # state_dict(): one entry per table shard / parameter


def test_loss_decreases_and_matches_ddp_dense_training(reports):
    losses, ddp_losses = reports[0]["losses"], reports[0]["ddp_losses"]
    assert len(losses) == STEPS and sum(losses[-3:]) < sum(losses[:3])
    assert max(abs(a - b) for a, b in zip(losses, ddp_losses)) < 1e-4  # FSDP does not change the math


def test_without_the_broadcast_the_ranks_start_from_a_patchwork(reports):
    # DMP's sharded tables draw from each rank's RNG differently, so the dense inits differ across ranks
    assert abs(reports[0]["unsynced_first_loss"] - reports[0]["ddp_losses"][0]) > 1e-4


def test_ranks_agree_on_the_full_dense_parameters(reports):
    for name, full in reports[0]["full_dense"].items():
        assert torch.equal(full, reports[1]["full_dense"][name])


def test_memory_by_part_shards_the_dense_part_only(reports):
    dense_numel = sum(t.numel() for t in reports[0]["full_dense"].values())
    fsdp_params = sum(r["memory"]["dense"]["params"] for r in reports)
    assert fsdp_params == 4 * dense_numel  # the shards of both ranks make one copy
    for r in reports:
        assert r["ddp_memory"]["dense"] == {"params": 4 * dense_numel, "grads": 4 * dense_numel,
                                            "optimizer": 8 * dense_numel, "total": 16 * dense_numel}
        assert r["memory"]["embeddings"] == r["ddp_memory"]["embeddings"]
        assert r["memory"]["embeddings"]["params"] > 0


def test_wrapper_refuses_a_dense_path_that_holds_embeddings():
    def build():
        import torch

        from course_lib import data, hybrid, models

        torch.manual_seed(0)
        config = data.ClickLogConfig(num_train=1024, num_test=1024)
        model = models.click_dlrm(config.tables(16), config.num_dense, device="meta")
        hybrid.shard_hybrid(model, wrapper=hybrid.FullyShardDense(dense=["model"]))

    from course_lib import LaunchError

    with pytest.raises(LaunchError, match="holds a sharded embedding module"):
        launch(build, world_size=2, show_ranks=[])
