"""course_lib.optimizers: bytes of optimizer state (plain, keyed, combined, fused and sharded) and step reports."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from course_lib import launch, optimizers, sharding

cloudpickle.register_pickle_by_value(sys.modules[__name__])

TABLES = [EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=100, feature_names=["f"])]


def test_local_bytes_and_shape_of_a_plain_tensor():
    t = torch.zeros(3, 5)
    assert optimizers.local_bytes(t) == 60
    assert optimizers.local_shape(t) == (3, 5)


def test_state_rows_of_adam_leave_out_the_step_unless_asked():
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(layer.parameters())
    layer(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    rows = optimizers.state_rows(optimizer)
    assert sorted({row["state"] for row in rows}) == ["exp_avg", "exp_avg_sq"]
    assert optimizers.state_bytes(optimizer) == 2 * (4 * 2 + 2) * 4
    assert optimizers.state_bytes(optimizer, include_step=True) > optimizers.state_bytes(optimizer)


def test_keyed_and_combined_optimizers_name_their_parameters():
    layer = torch.nn.Linear(4, 2)
    weight = KeyedOptimizerWrapper({"weight": layer.weight}, lambda p: torch.optim.Adagrad(p))
    bias = KeyedOptimizerWrapper({"bias": layer.bias}, lambda p: torch.optim.Adagrad(p))
    combined = CombinedOptimizer([weight, bias])
    rows = optimizers.state_rows(combined)
    assert {(row["parameter"], row["local shape"]) for row in rows} == {("weight", (2, 4)), ("bias", (2,))}
    assert optimizers.state_bytes(combined) == (8 + 2) * 4


def test_measure_training_reports_the_dense_gradient_of_an_unsharded_ebc():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=TABLES)
    batches = [sharding.random_batch(TABLES, 8, seed=s) for s in range(3)]
    report = optimizers.measure_training(ebc, torch.optim.Adam(ebc.parameters(), lr=0.1), batches)
    table_bytes = 100 * 8 * 4
    assert (report.params, report.grads, report.optimizer) == (table_bytes, table_bytes, 2 * table_bytes)
    assert report.as_dict()["total"] == 4 * table_bytes and report.ms > 0


def test_measure_training_needs_more_batches_than_warmup():
    ebc = EmbeddingBagCollection(tables=TABLES)
    with pytest.raises(ValueError, match="warmup"):
        optimizers.measure_training(ebc, torch.optim.SGD(ebc.parameters(), lr=0.1), [sharding.random_batch(TABLES, 4, seed=0)])


def _fused_row_wise_report():
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    torch.manual_seed(0)
    reports = {}
    for name, optimizer in {"adagrad": EmbOptimType.EXACT_ADAGRAD, "rowwise": EmbOptimType.EXACT_ROWWISE_ADAGRAD}.items():
        sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer, "learning_rate": 0.1})
        model = optimizers.row_wise_ebc(TABLES, sharder)
        batches = [sharding.rank_slice(sharding.random_batch(TABLES, 8, seed=s), dist.get_rank(), 2) for s in range(2)]
        report = optimizers.measure_training(model, model.fused_optimizer, batches)
        reports[name] = {**report.as_dict(), "rows": optimizers.state_rows(model.fused_optimizer)}
    dense = optimizers.row_wise_ebc(TABLES, kernel="dense")
    reports["dense kernel"] = [(n, tuple(p.shape)) for n, p in dense.named_parameters()]
    return reports


def test_row_wise_ebc_and_the_fused_state_per_rank():
    for report in launch(_fused_row_wise_report, world_size=2, show_ranks=[]):
        adagrad, rowwise = report["adagrad"], report["rowwise"]
        assert adagrad["grads"] == rowwise["grads"] == 0  # a fused table keeps no gradient
        assert adagrad["params"] == 50 * 8 * 4
        assert [(r["state"], r["local shape"], r["bytes"]) for r in adagrad["rows"]] == [("t.momentum1", (50, 8), 1600)]
        assert [(r["state"], r["local shape"], r["bytes"]) for r in rowwise["rows"]] == [("t.momentum1", (50,), 200)]
        assert rowwise["optimizer"] == 200
        assert report["dense kernel"] == [("embedding_bags.t.weight", (50, 8))]
