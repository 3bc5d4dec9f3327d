"""course_lib.sharding: batches split like a data-parallel job's, and sharded EBCs match the unsharded one."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from torchrec import EmbeddingBagConfig

from course_lib import launch, sharding

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TABLES = [
    EmbeddingBagConfig(name=name, embedding_dim=8, num_embeddings=rows, feature_names=[f"{name}_id"])
    for name, rows in [("user", 96), ("item", 64), ("category", 8)]
]


def test_random_batch_is_seeded_and_in_range():
    a, b = sharding.random_batch(TABLES, 6, seed=3), sharding.random_batch(TABLES, 6, seed=3)
    assert torch.equal(a.values(), b.values()) and torch.equal(a.lengths(), b.lengths())
    assert a.keys() == ["user_id", "item_id", "category_id"] and a.stride() == 6
    for table in TABLES:
        ids = a[table.feature_names[0]].values()
        assert ids.numel() == 0 or int(ids.max()) < table.num_embeddings
    assert not torch.equal(a.values(), sharding.random_batch(TABLES, 6, seed=4).values())


def test_rank_slices_put_the_global_batch_back_together():
    batch = sharding.random_batch(TABLES, 6, seed=0)
    slices = [sharding.rank_slice(batch, rank, 3) for rank in range(3)]
    for key in batch.keys():
        whole = batch[key]
        assert torch.equal(torch.cat([s[key].lengths() for s in slices]), whole.lengths())
        assert torch.equal(torch.cat([s[key].values() for s in slices]), whole.values())
    assert all(s.stride() == 2 for s in slices)
    with pytest.raises(ValueError, match="does not split evenly"):
        sharding.rank_slice(batch, 0, 4)


def test_reference_ebc_is_seeded_and_leaves_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a = sharding.reference_ebc(TABLES, seed=5)
    after = torch.rand(1)
    b = sharding.reference_ebc(TABLES, seed=5)
    assert torch.equal(before, after)
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key])


def test_max_abs_diff():
    a = {"x": torch.tensor([1.0, 2.0]), "y": torch.tensor([0.0])}
    assert sharding.max_abs_diff(a, {"x": torch.tensor([1.0, 2.5]), "y": torch.tensor([0.0])}) == 0.5
    with pytest.raises(ValueError, match="different keys"):
        sharding.max_abs_diff(a, {"x": a["x"]})


def compare_every_type():
    import torch.distributed as dist

    from course_lib import planning, sharding

    found = {}
    for sharding_type in ("table_wise", "column_wise", "row_wise", "data_parallel"):
        plan = planning.one_type_plan(TABLES, sharding_type, world_size=dist.get_world_size(), process_group=dist.group.WORLD)
        found[sharding_type] = sharding.compare_with_unsharded(TABLES, plan, steps=2, batch_size=4)
    found["control"] = sharding.compare_with_unsharded(TABLES, plan, steps=2, batch_size=4, average_rank_losses=False)
    return found


def loaded_weights_and_awaitable():
    import torch.distributed as dist

    from course_lib import planning, sharding

    reference = sharding.reference_ebc(TABLES, seed=7)
    model = sharding.shard(TABLES, planning.one_type_plan(TABLES, "row_wise", world_size=2), weights_from=reference)
    weights = sharding.full_weights(model)
    out = model(sharding.rank_slice(sharding.random_batch(TABLES, 4, seed=0), dist.get_rank(), 2))
    return (
        sharding.max_abs_diff(weights, reference.state_dict()),
        type(out).__name__,
        sorted(sharding.pooled(out)),
        sharding.dense_optimizer(model, 0.1) is None,
    )


@pytest.fixture(scope="module")
def compared():
    return launch(compare_every_type, world_size=2, show_ranks=[])


@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise", "row_wise", "data_parallel"])
def test_sharded_ebc_matches_the_unsharded_one(compared, sharding_type):
    for rank_result in compared:
        assert rank_result[sharding_type]["forward"] <= 1e-6
        assert rank_result[sharding_type]["weights"] <= 1e-6


def test_the_comparison_catches_a_wrong_reference(compared):
    assert all(rank_result["control"]["weights"] > 1e-3 for rank_result in compared)


def test_weights_load_into_shards_and_outputs_are_awaitables():
    for diff, out_type, features, no_dense in launch(loaded_weights_and_awaitable, world_size=2, show_ranks=[]):
        assert diff == 0.0
        assert out_type == "EmbeddingBagCollectionAwaitable"
        assert features == ["category_id", "item_id", "user_id"]
        assert no_dense  # row-wise with the fused kernel: the optimizer lives in backward
