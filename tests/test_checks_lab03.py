"""The 03_sharding checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import copy

import pytest
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints

from course_lib import planning
from course_lib.checks import CheckFailed, lab03

from conftest import rejects

TABLES = lab03.TABLES
CLUSTER = planning.topology(8, local_world_size=4, compute_device="cuda", hbm_cap_bytes=16 * 1024**3)


def planned(topology, constraints):
    planner = EmbeddingShardingPlanner(topology=topology, constraints=constraints)
    return planner.plan(planning.meta_ebc(TABLES), [EmbeddingBagCollectionSharder()])


# ------------------------------------------------------------------------------------- exercise 1: row-wise


def row_wise_item_plan(topology):
    return planned(topology, {"item": ParameterConstraints(sharding_types=["row_wise"])})


def shard_rows(plan, table):
    shards = sorted(plan.plan[""][table].sharding_spec.shards, key=lambda shard: shard.shard_offsets[0])
    return [shard.shard_sizes[0] for shard in shards]


def test_row_wise_check_accepts_the_solution(capsys):
    lab03.check_row_wise(row_wise_item_plan, shard_rows)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "8 shards of 256 rows" in out and "342" in out


def one_type(sharding_type):
    return lambda topology: planned(topology, {"item": ParameterConstraints(sharding_types=[sharding_type], min_partition=8)})


FIXED = row_wise_item_plan(CLUSTER)


def dropped_shard(topology):
    plan = row_wise_item_plan(topology)
    del plan.plan[""]["item"].sharding_spec.shards[3]  # the learner "fixes" the plan by hand: rows now in no shard
    return plan


def short_last_shard(topology):
    plan = row_wise_item_plan(topology)
    plan.plan[""]["item"].sharding_spec.shards[-1].shard_sizes[0] = 100
    return plan


@pytest.mark.parametrize(
    "plan_fn, words",
    [
        (one_type("table_wise"), "sharded table_wise, not row_wise"),
        (one_type("column_wise"), "sharded column_wise, not row_wise"),
        (one_type("table_row_wise"), "inside one host"),
        (one_type("grid_shard"), "sharded grid_shard"),
        (one_type("data_parallel"), "sharded data_parallel"),
        (lambda topology: planned(topology, {"user": ParameterConstraints(sharding_types=["row_wise"])}), "not row_wise"),
        (lambda topology: FIXED, "plan on the topology you are given"),  # ignores its argument
        (lambda topology: planned(topology, {t.name: ParameterConstraints(sharding_types=["row_wise"]) for t in TABLES}),
         "leave the other tables to the planner"),  # every table row-wise
        (dropped_shard, "are in no shard"),
        (short_last_shard, "cover rows 0:"),
        (lambda topology: row_wise_item_plan(topology).plan[""], "not a ShardingPlan"),
    ],
)
def test_row_wise_check_rejects_wrong_plans(plan_fn, words):
    with pytest.raises(CheckFailed, match=words):
        lab03.check_row_wise(plan_fn, shard_rows)


def in_listed_order(plan, table):
    return [shard.shard_sizes[0] for shard in plan.plan[""][table].sharding_spec.shards]


@pytest.mark.parametrize(
    "reader, words",
    [
        (lambda plan, table: [2048 // 8] * 8, "shards of 'item' have \\[342"),  # the cluster's answer, typed
        (lambda plan, table: [2048], "shards of 'item' have"),
        (lambda plan, table: [s.shard_offsets[0] for s in sorted(plan.plan[""][table].sharding_spec.shards, key=lambda s: s.shard_offsets[0])], "first rows"),
        (in_listed_order, "wrong order"),
        (lambda plan, table: "256", "shards of 'item' have"),
        (lambda plan, table: None, "list of ints"),
        (lambda plan, table: plan.plan[table], "raised KeyError"),
    ],
)
def test_row_wise_check_rejects_wrong_readings(reader, words):
    with pytest.raises(CheckFailed, match=words):
        lab03.check_row_wise(row_wise_item_plan, reader)


def test_row_wise_check_wants_functions():
    with pytest.raises(CheckFailed, match="function of the topology"):
        lab03.check_row_wise(FIXED, shard_rows)


# ------------------------------------------------------------------------------------- exercise 2: steering

SOLUTION = {
    "item": ParameterConstraints(sharding_types=["table_row_wise"]),
    "user": ParameterConstraints(sharding_types=["row_wise"]),
}


def hosts_of(plan, ranks_per_host):
    return {name: {rank // ranks_per_host for rank in sharding.ranks} for name, sharding in plan.plan[""].items()}


def test_steering_check_accepts_the_solutions(capsys):
    lab03.check_steering(SOLUTION, hosts_of)
    assert capsys.readouterr().out.startswith("✓")
    lab03.check_steering(lambda: SOLUTION, hosts_of)  # as the lab asks: a function that returns them
    assert capsys.readouterr().out.startswith("✓")
    columns = {**SOLUTION, "user": ParameterConstraints(sharding_types=["column_wise"], min_partition=4)}
    lab03.check_steering(columns, hosts_of)
    assert capsys.readouterr().out.startswith("✓")


def test_the_default_plan_breaks_the_budget():
    """The exercise is only worth doing if the planner left alone fails it (and if steering one table does)."""
    for constraints in ({}, {"item": SOLUTION["item"]}, {"user": SOLUTION["user"]}):
        totals = planning.bytes_per_rank(lab03.steer_plan(constraints), TABLES, 4).loc["total"]
        assert totals.max() > lab03.STEER_BUDGET_BYTES


C = ParameterConstraints


@pytest.mark.parametrize(
    "constraints, words",
    [
        ({}, "over the 136 KiB budget"),  # the planner left alone
        ({"item": C(sharding_types=["table_row_wise"])}, "over the 136 KiB budget"),  # only half the decision
        ({"user": C(sharding_types=["row_wise"])}, "left 'item' to the planner, and it chose data_parallel"),
        ({"user": C(sharding_types=["column_wise"], min_partition=4)}, "is data_parallel, on hosts \\[0, 1\\]"),
        ({**SOLUTION, "item": C(sharding_types=["row_wise"])}, "row_wise cuts the rows over every rank"),
        ({**SOLUTION, "item": C(sharding_types=["data_parallel"])}, "full copy on every rank"),
        ({**SOLUTION, "item": C(sharding_types=["grid_shard"], min_partition=4)}, "lookups cross hosts"),
        ({"item": C(sharding_types=["column_wise"], min_partition=4)}, "over the 136 KiB budget"),
        ({t.name: C(sharding_types=["table_row_wise"]) for t in TABLES}, "rank 0 holds 144 KiB"),
        ({**SOLUTION, "items": C(sharding_types=["table_row_wise"])}, "do not exist"),
        ({"item": "table_row_wise", "user": "row_wise"}, "is a str"),
        ([("item", SOLUTION["item"])], "must be a dict"),
        (lambda: None, "must be a dict"),  # a function that forgot to return
    ],
)
def test_steering_check_rejects_wrong_constraints(constraints, words):
    with pytest.raises(CheckFailed, match=words):
        lab03.check_steering(constraints, hosts_of)


def test_steering_check_rejects_a_hand_plan():
    from torchrec.distributed.sharding_plan import row_wise, table_row_wise, table_wise

    plan = planning.hand_plan(
        TABLES,
        {"user": row_wise(), "item": table_row_wise(host_index=0), "city": table_wise(rank=2), "category": table_wise(rank=3)},
        world_size=4, local_world_size=2, device_type="cuda",
    )
    for answer in (plan, plan.plan[""]):
        with pytest.raises(CheckFailed, match="a plan, not constraints"):
            lab03.check_steering(answer, hosts_of)


def first_shard_only(plan, ranks_per_host):
    return {name: {sharding.ranks[0] // ranks_per_host} for name, sharding in plan.plan[""].items()}


def from_sharding_spec(plan, ranks_per_host):
    return {
        name: {shard.placement.rank() // ranks_per_host for shard in sharding.sharding_spec.shards}
        for name, sharding in plan.plan[""].items()
    }


def skipping_data_parallel(plan, ranks_per_host):
    return {
        name: {shard.placement.rank() // ranks_per_host for shard in sharding.sharding_spec.shards}
        for name, sharding in plan.plan[""].items()
        if sharding.sharding_spec is not None
    }


@pytest.mark.parametrize(
    "reader, words",
    [
        (lambda plan, n: {k: {r % n for r in s.ranks} for k, s in plan.plan[""].items()}, "LOCAL_RANK"),
        (lambda plan, n: {k: {r // 2 for r in s.ranks} for k, s in plan.plan[""].items()}, "2 hosts x 4 GPUs"),
        (lambda plan, n: {k: set(s.ranks) for k, s in plan.plan[""].items()}, "those are ranks, not hosts"),
        (first_shard_only, "but it is on hosts"),
        (from_sharding_spec, "no sharding_spec"),
        (skipping_data_parallel, "left out 'category' \\(data_parallel\\)"),
        (lambda plan, n: [0, 1], "returned a list"),
        (lambda plan, n: {k: "host 0" for k in plan.plan[""]}, "set \\(or list\\) of host numbers"),
    ],
)
def test_steering_check_rejects_wrong_hosts_of(reader, words):
    with pytest.raises(CheckFailed, match=words):
        lab03.check_steering(SOLUTION, reader)


def test_a_second_function_still_unwritten_is_named():
    def unwritten(*args):
        raise NotImplementedError()

    with pytest.raises(CheckFailed, match="hosts_of is not written yet"):
        lab03.check_steering(SOLUTION, unwritten)
    with pytest.raises(CheckFailed, match="shard_rows is not written yet"):
        lab03.check_row_wise(row_wise_item_plan, unwritten)


# ------------------------------------------------------------------ more wrong answers (adversarial review)


def only_the_item_table(topology):  # plans part of the model: the other tables would be in no plan
    planner = EmbeddingShardingPlanner(topology=topology, constraints={"item": ParameterConstraints(sharding_types=["row_wise"])})
    return planner.plan(planning.meta_ebc([t for t in TABLES if t.name == "item"]), [EmbeddingBagCollectionSharder()])


def test_row_wise_check_rejects_a_plan_of_part_of_the_model():
    rejects(lab03.check_row_wise, only_the_item_table, shard_rows, match="leaves out tables ['user', 'city', 'category']")


def in_rank_order(plan, table):  # shard r holds the r-th block only by the planner's habit
    shards = sorted(plan.plan[""][table].sharding_spec.shards, key=lambda shard: shard.placement.rank())
    return [shard.shard_sizes[0] for shard in shards]


def an_even_split(plan, table):  # worked out from the table's size instead of read from the plan
    shards = plan.plan[""][table].sharding_spec.shards
    total = sum(shard.shard_sizes[0] for shard in shards)
    block = -(-total // len(shards))
    return [min(block, total - i * block) for i in range(len(shards))]


@pytest.mark.parametrize(
    "reader, words",
    [
        (in_rank_order, "those are in rank order"),
        (an_even_split, "an even split worked out from the table's size"),
    ],
)
def test_row_wise_check_rejects_readings_that_hold_for_the_planners_cut_only(reader, words):
    rejects(lab03.check_row_wise, row_wise_item_plan, reader, match=words)


def first_and_last_rank(plan, ranks_per_host):  # right while a table spans at most 2 hosts
    return {name: {s.ranks[0] // ranks_per_host, s.ranks[-1] // ranks_per_host} for name, s in plan.plan[""].items()}


def data_parallel_on_hosts_0_and_1(plan, ranks_per_host):  # the lab's 2 hosts, typed in for the copies
    return {
        name: {0, 1} if s.sharding_spec is None else {shard.placement.rank() // ranks_per_host for shard in s.sharding_spec.shards}
        for name, s in plan.plan[""].items()
    }


@pytest.mark.parametrize(
    "reader, words",
    [
        (first_and_last_rank, "'item' is on hosts [0, 2], but it is on hosts [0, 1, 2]"),
        (data_parallel_on_hosts_0_and_1, "a data_parallel table has a full copy on every rank"),
    ],
)
def test_steering_check_reads_hosts_off_a_plan_on_3_hosts(reader, words):
    rejects(lab03.check_steering, SOLUTION, reader, match=words)


def test_row_wise_check_asks_shard_rows_about_another_table():
    def always_item(plan, table):  # ignores its `table` argument
        return shard_rows(plan, "item")

    rejects(lab03.check_row_wise, row_wise_item_plan, always_item, match="table 'user', but the shards of 'user' have [1024, 1024, 1024, 1024]")


# ------------------------------------------------------------------ answers that change the plan they read


def sorts_in_place(plan, table):  # the caller's plan now lists its shards in another order
    shards = plan.plan[""][table].sharding_spec.shards
    shards.sort(key=lambda shard: shard.shard_offsets[0])
    return [shard.shard_sizes[0] for shard in shards]


def test_row_wise_check_rejects_a_shard_rows_that_sorts_the_plan_in_place():
    rejects(lab03.check_row_wise, row_wise_item_plan, sorts_in_place,
            match="shard_rows changed its argument 1 (a ShardingPlan) in place: the caller's plan")


def ranks_rewritten_as_hosts(plan, ranks_per_host):  # stores its answer in the plan's own ranks lists
    for sharding in plan.plan[""].values():
        sharding.ranks[:] = [rank // ranks_per_host for rank in sharding.ranks]
    return {name: set(sharding.ranks) for name, sharding in plan.plan[""].items()}


def test_steering_check_rejects_a_hosts_of_that_rewrites_the_plan():
    rejects(lab03.check_steering, SOLUTION, ranks_rewritten_as_hosts,
            match="hosts_of changed its argument 1 (a ShardingPlan) in place")


def test_steering_budget_hint_names_no_copy_too_light_to_matter():
    # 196 KiB on rank 0 against 136: the 4 KiB data-parallel category cannot make up 60 KiB, so it is not the advice
    constraints = {"item": C(sharding_types=["table_row_wise"]), "user": C(sharding_types=["column_wise"], min_partition=8)}
    with pytest.raises(CheckFailed, match="over the 136 KiB budget") as failure:
        lab03.check_steering(constraints, hosts_of)
    assert "constrain them too" not in str(failure.value) and "weighs less on each" in str(failure.value)


def hosts_from_first_to_last(plan, ranks_per_host):  # every host between the first rank's and the last rank's
    return {
        name: set(range(min(s.ranks) // ranks_per_host, max(s.ranks) // ranks_per_host + 1))
        for name, s in plan.plan[""].items()
    }


def test_steering_check_rejects_hosts_filled_in_from_first_to_last():
    # right while every table's hosts are consecutive, as in every plan the planner makes of the lab's tables;
    # two column shards on ranks 0 and 4 of 3 hosts x 2 leave host 1 out
    rejects(lab03.check_steering, SOLUTION, hosts_from_first_to_last,
            match="hosts_of says 'user' is on hosts [0, 1, 2], but it is on hosts [0, 2] (a plan on 3 hosts x 2 GPUs "
                  "with 'user' column-wise on ranks 0 and 4)")
