"""The 03_sharding checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import copy

import pytest
from torchrec import EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints

from course_lib import planning
from course_lib.checks import CheckFailed, lab03

TABLES = [
    EmbeddingBagConfig(name=name, embedding_dim=16, num_embeddings=rows, feature_names=[f"{name}_id"])
    for name, rows in [("user", 4096), ("item", 2048), ("city", 512), ("category", 64)]
]
GPU_TOPOLOGY = dict(world_size=8, local_world_size=4, compute_device="cuda", hbm_cap_bytes=16 * 1024**3)


def gpu_plan(constraints=None):
    planner = EmbeddingShardingPlanner(topology=planning.topology(**GPU_TOPOLOGY), constraints=constraints)
    return planner.plan(planning.meta_ebc(TABLES), [EmbeddingBagCollectionSharder()])


@pytest.fixture(scope="module")
def row_wise_plan():
    return gpu_plan({"item": ParameterConstraints(sharding_types=["row_wise"])})


# ------------------------------------------------------------------------------------- exercise 1


def test_row_wise_check_accepts_the_solution(row_wise_plan, capsys):
    lab03.check_row_wise(row_wise_plan, [256] * 8, TABLES)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "8 shards of 256 rows" in out


@pytest.mark.parametrize(
    "sharding_type, words",
    [("table_wise", "not row_wise"), ("column_wise", "not row_wise"), ("table_row_wise", "inside one host")],
)
def test_row_wise_check_rejects_other_sharding_types(sharding_type, words):
    plan = gpu_plan({"item": ParameterConstraints(sharding_types=[sharding_type], min_partition=8)})
    with pytest.raises(CheckFailed, match=words):
        lab03.check_row_wise(plan, [256] * 8, TABLES)


def test_row_wise_check_rejects_shards_that_miss_rows(row_wise_plan):
    plan = copy.deepcopy(row_wise_plan)
    del plan.plan[""]["item"].sharding_spec.shards[3]  # rows 768:1024 now in no shard
    with pytest.raises(CheckFailed, match="rows 768:1024 are in no shard"):
        lab03.check_row_wise(plan, [256] * 7, TABLES)


def test_row_wise_check_rejects_a_short_last_shard(row_wise_plan):
    plan = copy.deepcopy(row_wise_plan)
    plan.plan[""]["item"].sharding_spec.shards[-1].shard_sizes[0] = 100
    with pytest.raises(CheckFailed, match="cover rows 0:1892"):
        lab03.check_row_wise(plan, [256] * 7 + [100], TABLES)


@pytest.mark.parametrize(
    "shard_rows, words",
    [([2048], "the plan's shards"), ([256] * 4, "the plan's shards"), ("256", "the plan's shards"), (None, "list of ints")],
)
def test_row_wise_check_rejects_a_wrong_reading(row_wise_plan, shard_rows, words):
    with pytest.raises(CheckFailed, match=words):
        lab03.check_row_wise(row_wise_plan, shard_rows, TABLES)


def test_row_wise_check_rejects_what_is_not_a_plan(row_wise_plan):
    with pytest.raises(CheckFailed, match="not a ShardingPlan"):
        lab03.check_row_wise(row_wise_plan.plan[""], [256] * 8, TABLES)


# ------------------------------------------------------------------------------------- exercise 2

SOLUTION = {"query": 0, "doc": 0, "author": 1, "site": 1, "topic": 1}


def test_balance_check_accepts_the_solution(capsys):
    lab03.check_balanced(SOLUTION)
    assert capsys.readouterr().out.startswith("✓")
    lab03.check_balanced({name: 1 - rank for name, rank in SOLUTION.items()})  # the mirror image


@pytest.mark.parametrize(
    "assignment, words",
    [
        ({"query": 0, "doc": 1, "author": 1, "site": 0, "topic": 0}, "spread 26.7%"),  # greedy, largest first
        ({name: 0 for name in SOLUTION}, "spread 200.0%"),  # everything on one rank
        ({"query": 0, "doc": 1, "author": 1, "site": 0}, "drops 'topic'"),
        ({**SOLUTION, "user": 0}, "do not exist"),
        ({**SOLUTION, "topic": 2}, "a rank is an int"),
        ({**SOLUTION, "topic": "1"}, "a rank is an int"),
        ([("query", 0)], "must be a dict"),
    ],
)
def test_balance_check_rejects_wrong_answers(assignment, words):
    with pytest.raises(CheckFailed, match=words):
        lab03.check_balanced(assignment)


def test_greedy_placement_is_what_the_hint_says():
    """The exercise is only worth doing if the greedy answer fails it: check the numbers stay that way."""
    loads = [0, 0]
    for table in sorted(lab03.BALANCE_TABLES, key=lambda t: -t.num_embeddings):
        loads[loads.index(min(loads))] += table.num_embeddings
    assert sorted(loads) == [13000, 17000]
