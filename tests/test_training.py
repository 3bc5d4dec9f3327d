"""course_lib.training and models.click_dlrm: the step, the loop, plans, what DMP holds, the train pipeline."""
from __future__ import annotations

import logging
import sys

import cloudpickle
import pytest
import torch

from course_lib import data, launch, models, training

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONFIG = data.ClickLogConfig(num_train=20_000, num_test=3_001, seed=2)


@pytest.fixture(scope="module")
def log() -> data.ClickLog:
    return data.make_click_log(CONFIG)


def test_click_dlrm_is_torchrecs_dlrm_with_the_loss_inside(log):
    from torchrec.models.dlrm import DLRM, DLRMTrain

    torch.manual_seed(0)
    model = models.click_dlrm(log.tables(8), log.config.num_dense, hidden=16)
    assert isinstance(model, DLRMTrain) and isinstance(model.model, DLRM)
    batch = log.train.batch(0, 5)
    loss, (detached_loss, logits, labels) = model(batch)
    assert loss.requires_grad and not logits.requires_grad
    assert logits.shape == (5,) and torch.equal(labels, batch.labels)
    assert loss.item() == pytest.approx(detached_loss.item())
    on_meta = models.click_dlrm(log.tables(8), log.config.num_dense, device="meta")
    assert all(p.is_meta for p in on_meta.parameters())
    with pytest.raises(ValueError, match="one embedding_dim"):
        models.click_dlrm([*log.tables(8)[:1], *log.tables(4)[1:]], log.config.num_dense)


def test_train_step_lowers_the_loss_of_an_unsharded_model(log):
    torch.manual_seed(0)
    model = models.click_dlrm(log.tables(8), log.config.num_dense, hidden=16)
    optimizer = training.optimizer(model, dense_learning_rate=0.01)  # no fused optimizer: Adam over everything
    batch = log.train.batch(0, 256)
    losses = [training.train_step(model, optimizer, batch) for _ in range(30)]
    assert all(isinstance(loss, float) for loss in losses)
    assert losses[-1] < 0.8 * losses[0]


def test_train_outside_a_process_group_reports_progress_and_stops_at_max_steps(log, capsys, monkeypatch):
    monkeypatch.delenv("COURSE_PROGRESS_FILE", raising=False)
    torch.manual_seed(0)
    model = models.click_dlrm(log.tables(8), log.config.num_dense, hidden=16)
    losses = training.train(model, training.optimizer(model), log.train, 512, epochs=2, max_steps=8, desc="fit")
    assert len(losses) == 8
    out = capsys.readouterr().out
    assert "fit: step 1/8" in out and "fit: step 8/8 (100%)" in out


def test_require_pipelined_reads_torchrecs_verdicts():
    ok = ["Module 'model.sparse_arch.embedding_bag_collection' will be pipelined"]
    assert training.require_pipelined(ok) == ["model.sparse_arch.embedding_bag_collection"]
    refused = ["Module 'model.sparse_arch.embedding_bag_collection' will NOT be pipelined, due to input modifications"]
    with pytest.raises(RuntimeError, match="will NOT be pipelined"):
        training.require_pipelined(refused)
    with pytest.raises(RuntimeError, match="no sharded module"):
        training.require_pipelined([])


def test_pipelining_log_collects_only_while_open_and_restores_the_logger():
    logger = logging.getLogger("torchrec.distributed.train_pipeline.utils")
    before = (logger.level, logger.propagate, list(logger.handlers))
    with training.pipelining_log() as messages:
        logger.info("Module 'a.b' will be pipelined")
        logger.info("something else")
    logger.warning("Module 'c' will NOT be pipelined, due to input modifications")
    assert messages == ["Module 'a.b' will be pipelined"]
    assert (logger.level, logger.propagate, list(logger.handlers)) == before


def sharded_run(log):
    """On every rank: a hand plan with four sharding types, what DMP holds, a short training, predictions,
    and a train pipeline on the same model."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_wise
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    torch.manual_seed(0)
    # (CONFIG, not log.config: cloudpickle would take the attribute name `config` for torch.distributed.config)
    model = models.click_dlrm(log.tables(16), CONFIG.num_dense, device="meta")
    per_table = {"t_user": row_wise(compute_kernel="fused"), "t_item": column_wise(ranks=[0, 1]),  # dense kernel
                 "t_category": data_parallel(), "t_terms": table_wise(rank=1, compute_kernel="fused")}
    plan = training.model_plan(model, per_table, world_size=dist.get_world_size())
    dmp = DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())
    result = {"types": training.sharding_types(dmp), "state": training.state_dict_shards(dmp)}
    optimizer = training.optimizer(dmp)
    result["adam"] = sorted(name.split(".")[-2] for name, _ in optimizer.optimizers[1][1].params.items())
    result["losses"] = training.train(dmp, optimizer, log.train, 256, max_steps=12, desc=None)
    result["spread"] = training.replica_spread(dmp)
    logits, labels = training.predict(dmp, log.test, batch_size=500)
    result.update(logits=logits, labels=labels, auc=training.auc(logits, labels))
    batches = data.batches(log.train, 256, dist.get_rank(), dist.get_world_size())
    result["plain step"] = training.step_collectives(dmp, lambda: training.train_step(dmp, optimizer, next(batches)))
    pipeline = TrainPipelineSparseDist(dmp, optimizer, training.device())
    with training.pipelining_log() as verdicts:
        for _ in range(3):
            pipeline.progress(batches)
    result["pipelined"] = training.require_pipelined(verdicts)
    result["pipelined step"] = training.step_collectives(dmp, lambda: pipeline.progress(batches))
    return result


def test_a_sharded_dlrm_on_two_ranks(log):
    rank0, rank1 = launch(sharded_run, log, world_size=2, show_ranks=[])
    assert rank0["types"] == {
        "t_user": ("row_wise", (0, 1)),
        "t_item": ("column_wise", (0, 1)),
        "t_category": ("data_parallel", (0, 1)),
        "t_terms": ("table_wise", (1,)),
    }
    state = {row["key"].split(".")[-2]: row for row in rank0["state"]}
    state1 = {row["key"].split(".")[-2]: row for row in rank1["state"]}
    assert state["t_user"]["type"] == "ShardedTensor" and state["t_user"]["global shape"] == (500, 16)
    assert (state["t_user"]["stored here"], state1["t_user"]["stored here"]) == ("[0:250, 0:16]", "[250:500, 0:16]")
    assert (state["t_item"]["stored here"], state1["t_item"]["stored here"]) == ("[0:200, 0:8]", "[0:200, 8:16]")
    assert (state["t_terms"]["stored here"], state1["t_terms"]["stored here"]) == ("none", "[0:50, 0:16]")
    assert state["t_category"]["type"] == "Tensor" and state["t_category"]["stored here"] == "all"
    # the dense part and the data-parallel table are replicas that DDP keeps equal
    assert rank0["spread"] and max(rank0["spread"].values()) == 0.0
    assert {name.split(".")[-2] for name in rank0["spread"]} >= {"t_category", "_linear"}
    assert not any(table in name for name in rank0["spread"] for table in ("t_user", "t_item", "t_terms"))
    # Adam trains what no fused kernel updates: the dense layers, the data-parallel and the dense-kernel table
    assert {"t_category", "t_item"} <= set(rank0["adam"]) and not {"t_user", "t_terms"} & set(rank0["adam"])
    assert len(rank0["losses"]) == 12 and rank0["losses"][-1] < rank0["losses"][0]
    # every test row is scored on exactly one rank, and the synced AUC is that of all of them
    assert len(rank0["labels"]) + len(rank1["labels"]) == len(log.test)
    logits = torch.cat([rank0["logits"], rank1["logits"]])
    labels = torch.cat([rank0["labels"], rank1["labels"]])
    assert rank0["auc"] == rank1["auc"] == pytest.approx(data.auc(logits, labels), abs=1e-4)
    assert rank0["pipelined"] == ["model.sparse_arch.embedding_bag_collection"]
    # a plain step sends its ids inside its forward; the pipeline starts the next batch's input dist before
    # this batch's forward and sends its ids after it
    plain, pipelined = rank0["plain step"], rank0["pipelined step"]
    assert plain[0]["issued"] == "forward" and plain[0]["collective"] == "all_to_all"
    assert pipelined[0]["issued"] == "before forward" and pipelined[0]["collective"] == "all_to_all"
    ids_after_forward = [r for r in pipelined if r["issued"] == "after forward" and r["dtype"] == "int64"]
    assert ids_after_forward and not [r for r in plain if r["issued"] == "after forward" and r["dtype"] == "int64"]
    assert any(r["collective"] == "all_reduce" and r["issued"] == "after forward" for r in plain)


def test_model_plan_names_every_table(log):
    from torchrec.distributed.sharding_plan import table_wise

    model = models.click_dlrm(log.tables(16), log.config.num_dense, device="meta")
    with pytest.raises(ValueError, match="every table"):
        training.model_plan(model, {"t_user": table_wise(rank=0)}, world_size=2)


def test_model_plan_is_the_hand_plan_of_the_models_tables_at_the_ebcs_path(log):
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_wise

    from course_lib import planning

    per_table = {"t_user": row_wise(compute_kernel="fused"), "t_item": column_wise(ranks=[0, 1], compute_kernel="fused"),
                 "t_category": data_parallel(), "t_terms": table_wise(rank=1, compute_kernel="fused")}
    model = models.click_dlrm(log.tables(16), log.config.num_dense, device="meta")
    plan = training.model_plan(model, per_table, world_size=2)
    assert list(plan.plan) == ["model.sparse_arch.embedding_bag_collection"]
    by_hand = planning.hand_plan(log.tables(16), per_table, world_size=2, sharder=training.sharders()[0])
    assert dict(plan.plan["model.sparse_arch.embedding_bag_collection"]) == dict(by_hand.plan[""])
    with pytest.raises(ValueError, match=r"missing \['t_item', 't_terms'\], unknown \['t_other'\]"):
        training.model_plan(model, {"t_user": row_wise(), "t_category": data_parallel(), "t_other": row_wise()}, world_size=2)


def test_semi_sync_pipeline_refuses_to_run_on_cpu_streams():
    # TorchRec 1.8's TrainPipelineSemiSync calls record_stream on CUDA streams that CPUs do not have
    assert launch(training.semi_sync_attempt, world_size=2, show_ranks=[]) == ["RuntimeError: unknown parameter type"] * 2


def _all_fused_optimizer(tables):
    from course_lib import optimizers

    ebc = optimizers.row_wise_ebc(tables, training.sharders()[0])
    optimizer = training.optimizer(ebc)
    weights = [p for p in ebc.parameters() if p.numel()]
    before = [w.detach().clone() for w in weights]
    optimizer.zero_grad()
    ebc(data.make_click_log(data.ClickLogConfig(num_train=2_000, num_test=200)).train.batch(0, 64).sparse_features).values().pow(2).sum().backward()
    optimizer.step()
    return type(optimizer).__name__, len(optimizer.state_dict()["state"]), any(not torch.equal(b, w) for b, w in zip(before, weights))


def test_optimizer_of_a_model_of_fused_tables_only_is_the_fused_optimizer():
    # a dense optimizer over nothing raises "optimizer got an empty parameter list" (lab 05, torchrec #143)
    tables = data.make_click_log(data.ClickLogConfig(num_train=2_000, num_test=200)).tables(16)
    name, states, changed = launch(_all_fused_optimizer, tables, world_size=1, show_ranks=[])[0]
    assert name == "CombinedOptimizer" and states == len(tables) and changed
