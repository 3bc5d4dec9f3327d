"""course_lib.planning builds plans the way torchrec asks and reads them back correctly."""
from __future__ import annotations

import logging

import matplotlib
import pytest
from torchrec import EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_wise

from course_lib import planning

matplotlib.use("Agg")

TABLES = [
    EmbeddingBagConfig(name=name, embedding_dim=16, num_embeddings=rows, feature_names=[f"{name}_id"])
    for name, rows in [("user", 4096), ("item", 2048), ("city", 512), ("category", 64)]
]
MIXED = {
    "user": row_wise(compute_kernel="fused"),
    "item": column_wise(ranks=[0, 1], compute_kernel="fused"),
    "city": table_wise(rank=1, compute_kernel="fused"),
    "category": data_parallel(),
}


@pytest.fixture(scope="module")
def mixed():
    return planning.hand_plan(TABLES, MIXED, world_size=2)


def test_topology_is_built_by_the_factory_without_warnings(caplog):
    with caplog.at_level(logging.WARNING):
        topology = planning.topology(8, local_world_size=4, compute_device="cuda", hbm_cap_bytes=2**30)
    assert (topology.world_size, topology.local_world_size, topology.compute_device) == (8, 4, "cuda")
    assert topology.devices[0].storage.hbm == 2**30
    assert topology._created_by_factory
    assert "constructed directly" not in caplog.text


def test_hand_plan_shards_every_table_as_asked(mixed):
    table = planning.plan_table(mixed, TABLES)
    assert table["sharding type"].to_dict() == {
        "user": "row_wise", "item": "column_wise", "city": "table_wise", "category": "data_parallel",
    }
    assert table.loc["user", "shard shape"] == "2048 x 16" and table.loc["user", "ranks"] == "0,1"
    assert table.loc["item", "shard shape"] == "2048 x 8"
    assert table.loc["city", "ranks"] == "1"
    assert list(table["kernel"]) == ["fused", "fused", "fused", "dense"]


def test_hand_plan_names_every_table_once():
    with pytest.raises(ValueError, match=r"missing \['category'\]"):
        planning.hand_plan(TABLES, {k: v for k, v in MIXED.items() if k != "category"}, world_size=2)


def test_shards_cover_each_table_and_replicate_data_parallel(mixed):
    pieces = planning.shards(mixed, TABLES)
    for config in TABLES:
        mine = [s for s in pieces if s.table == config.name]
        area = sum(s.rows * s.cols for s in mine)
        copies = 2 if config.name == "category" else 1
        assert area == copies * config.num_embeddings * config.embedding_dim
        assert all(s.bytes == s.rows * s.cols * 4 for s in mine)
    frame = planning.shard_table(mixed, TABLES)
    assert len(frame) == len(pieces) == 7
    assert list(frame[frame.table == "user"]["rows"]) == ["0:2048", "2048:4096"]


def test_data_parallel_needs_the_tables_for_its_size(mixed):
    with pytest.raises(ValueError, match="pass `tables`"):
        planning.shards(mixed)


def test_bytes_per_rank_and_spread(mixed):
    frame = planning.bytes_per_rank(mixed, TABLES, world_size=2)
    assert frame.loc["city"].tolist() == [0, 512 * 16 * 4]
    assert frame.loc["category"].tolist() == [64 * 16 * 4] * 2
    assert frame.loc["total"].tolist() == [200704, 233472]
    assert planning.memory_spread(mixed, TABLES, world_size=2) == pytest.approx((233472 - 200704) / 217088)


def test_empty_ranks_count_in_the_spread():
    everything_on_0 = planning.table_plan(TABLES, {t.name: 0 for t in TABLES}, world_size=2)
    assert planning.bytes_per_rank(everything_on_0, TABLES, world_size=3).loc["total"].tolist()[1:] == [0, 0]
    assert planning.memory_spread(everything_on_0, TABLES, world_size=2) == pytest.approx(2.0)
    with pytest.raises(ValueError, match="beyond world_size"):
        planning.bytes_per_rank(planning.table_plan(TABLES, {t.name: 1 for t in TABLES}, world_size=2), TABLES, 1)


@pytest.mark.parametrize("sharding_type", ["table_wise", "column_wise", "row_wise", "data_parallel"])
def test_one_type_plan(sharding_type):
    plan = planning.one_type_plan(TABLES, sharding_type, world_size=2)
    pieces = planning.shards(plan, TABLES)
    assert {s.sharding_type for s in pieces} == {sharding_type}
    if sharding_type in ("column_wise", "row_wise"):
        assert all(len([s for s in pieces if s.table == t.name]) == 2 for t in TABLES)  # really cut in two
    if sharding_type != "data_parallel":
        assert {s.compute_kernel for s in pieces} == {"fused"}


def test_one_type_plan_refuses_what_cpu_cannot_plan():
    with pytest.raises(ValueError, match="cannot be planned on a CPU topology"):
        planning.one_type_plan(TABLES, "grid_shard", world_size=2)


def test_estimates_keep_the_planners_choice():
    estimates = planning.Estimates()
    plan = EmbeddingShardingPlanner(topology=planning.topology(2), callbacks=[estimates]).plan(
        planning.meta_ebc(TABLES), [EmbeddingBagCollectionSharder()]
    )
    table = estimates.table()
    assert sorted(table["table"]) == sorted(t.name for t in TABLES)
    placed = {s.table: s.rank for s in planning.shards(plan, TABLES)}
    assert dict(zip(table["table"], table["rank"])) == placed
    assert table["est. ms per step"].nunique() == 1  # same dim, same pooling: the same estimated time
    assert (table["est. KiB"] * 1024 > [t.num_embeddings * t.embedding_dim * 4 for t in TABLES]).all()


def test_planning_a_data_parallel_table_logs_no_root_notice(caplog):
    constraints = {"category": ParameterConstraints(sharding_types=["data_parallel"])}
    with caplog.at_level(logging.WARNING):
        EmbeddingShardingPlanner(topology=planning.topology(2), constraints=constraints).plan(
            planning.meta_ebc(TABLES), [EmbeddingBagCollectionSharder()]
        )
    assert "Sharding spec not found" not in caplog.text


def test_plot_shards_draws_one_patch_per_shard(mixed):
    fig = planning.plot_shards(mixed, TABLES)
    shards = [p for ax in fig.axes for p in ax.patches if p.get_gid() == "shard"]
    replicas = [p for ax in fig.axes for p in ax.patches if p.get_gid() == "replica"]
    assert (len(shards), len(replicas)) == (5, 1)
    cluster = planning.hand_plan(TABLES, {t.name: row_wise() for t in TABLES}, world_size=8, local_world_size=4,
                                 device_type="cuda")
    texts = [t.get_text() for ax in planning.plot_shards(cluster, TABLES, ranks_per_host=4).axes for t in ax.texts]
    assert "r5 h1" in texts


def test_plot_memory_stacks_every_table_for_every_plan(mixed):
    fig = planning.plot_memory({"a": mixed, "b": planning.one_type_plan(TABLES, "row_wise", world_size=2)}, TABLES, 2)
    panels = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().splitlines()[0] for ax in panels] == ["a", "b"]
    assert panels[1].get_title().endswith("spread 0%")
    for ax in panels:
        assert len([p for p in ax.patches if p.get_gid() == "segment"]) == len(TABLES) * 2


def test_byte_unit_is_the_largest_that_keeps_a_whole_number():
    assert planning.byte_unit(0) == "B" and planning.byte_unit(1023) == "B"
    assert planning.byte_unit(1024) == "KiB" and planning.byte_unit(3 * 2**20 - 1) == "MiB"
    assert planning.byte_unit(2**30) == "GiB" and planning.byte_unit(5 * 2**40) == "GiB"


def test_plot_memory_picks_its_unit_from_the_data(mixed):
    fig = planning.plot_memory(mixed, TABLES, 2)
    label = fig.axes[0].get_ylabel()
    fullest = float(planning.bytes_per_rank(mixed, TABLES, 2).drop(index="total").sum(axis=0).max())
    assert label == f"parameters ({planning.byte_unit(fullest)})"
    assert fig.axes[0].get_ylim()[1] >= 1  # never an axis at 0.00025
    assert planning.plot_memory(mixed, TABLES, 2, unit="B").axes[0].get_ylabel() == "parameters (B)"
