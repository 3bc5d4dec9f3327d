"""Checks for 03_sharding: constrain a plan to row-wise and read its shards; steer the planner with constraints
only (a per-rank byte budget, one table's lookups on one host) and read the hosts off the plan."""
from __future__ import annotations

import itertools
from typing import Any, Mapping, Sequence

from torchrec import EmbeddingBagConfig
from torchrec.distributed.types import ShardingPlan

from course_lib import planning
from course_lib.checks import CheckFailed, checked_call, exercise, fail, passed


def _tables(spec: Sequence[tuple[str, int]], dim: int = 16) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[f"{name}_id"])
        for name, rows in spec
    ]


# The lab's four tables (the check plans its own copy, whatever the notebook's TABLES became).
TABLES: list[EmbeddingBagConfig] = _tables([("user", 4096), ("item", 2048), ("city", 512), ("category", 64)])

# Exercise 2: steer the planner on 2 hosts x 2 GPUs (a plan, nothing runs on a GPU).
STEER_WORLD_SIZE = 4
STEER_RANKS_PER_HOST = 2
STEER_BUDGET_BYTES = 136 * 1024  # parameter bytes per rank (planning.bytes_per_rank)
STEER_TABLE = "item"  # its lookups must stay on one host


def steer_topology() -> Any:
    """The topology of exercise 2: 4 GPUs, 2 per host, 16 GiB of HBM each."""
    return planning.topology(
        STEER_WORLD_SIZE, local_world_size=STEER_RANKS_PER_HOST, compute_device="cuda", hbm_cap_bytes=16 * 2**30
    )


def steer_plan(constraints: Mapping[str, Any] | None, tables: Sequence[EmbeddingBagConfig] = TABLES) -> ShardingPlan:
    """What the planner makes of `tables` on :func:`steer_topology` under `constraints`: the check's own call."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    planner = EmbeddingShardingPlanner(topology=steer_topology(), constraints=dict(constraints or {}))
    return planner.plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB"


def _call(fn: Any, name: str, *args: Any) -> tuple[Any, BaseException | None]:
    """`fn(*args)` and the error it raised, if any (failing the check when the call changed an argument it was
    handed: a plan sorted or rewritten in place); the second function of an exercise still unwritten fails
    the check by its own name (outside the ``except``, so ``@exercise`` does not name the first function)."""
    from course_lib.checks import INPUT_CHANGED_HINT, InputChanged, _unwritten, call_unchanged

    try:
        return call_unchanged(name, fn, *args), None
    except InputChanged as changed:  # e.g. shards.sort(...) on the caller's plan
        caught = changed
    except Exception as error:  # noqa: BLE001  (the learner's code: report it)
        caught = error
    if isinstance(caught, InputChanged):
        fail(f"{caught}: the caller's plan, the one DMP would shard the model by, is no longer the plan the "
             "planner made", INPUT_CHANGED_HINT + "; sorted(shards, key=...) makes a new list")
    if _unwritten(caught):
        fail(f"{name} is not written yet", "replace `raise NotImplementedError()` with your code, then run this cell again")
    return None, caught


def _judge_row_wise(plan: Any, tables: Sequence[EmbeddingBagConfig], table: str, world_size: int, what: str) -> list[int]:
    """The row counts of `table`'s shards in `plan`, in row order, after checking it is row-wise over every rank."""
    if not isinstance(plan, ShardingPlan):
        fail(f"row_wise_item_plan returned a {type(plan).__name__} for {what}, not a ShardingPlan", "return what planner.plan(...) returns")
    config = next((t for t in tables if t.name == table), None)
    if config is None:
        fail(f"no table named {table!r} among the tables given to the check")
    try:
        pieces = [s for s in planning.shards(plan, tables) if s.table == table]
    except ValueError as exc:
        fail(f"cannot read the plan: {exc}")
    if not pieces:
        fail(f"the plan for {what} has no entry for table {table!r}", "plan the EBC of all the lab's tables (planning.meta_ebc(TABLES))")
    missing = [t.name for t in tables if t.name not in planning._module_plan(plan)]
    if missing:
        fail(
            f"the plan for {what} leaves out tables {missing}",
            f"a plan places every table of the model: plan the EBC of all the lab's tables (planning.meta_ebc(TABLES)) "
            f"and constrain {table!r} only",
        )
    kind = pieces[0].sharding_type
    if kind != "row_wise":
        hint = (
            "table_row_wise is row-wise inside one host only; ask for 'row_wise' to spread the rows over every rank"
            if kind == "table_row_wise"
            else f"pass constraints={{{table!r}: ParameterConstraints(sharding_types=['row_wise'])}} to the planner"
        )
        fail(f"table {table!r} is sharded {kind}, not row_wise ({what})", hint)
    pieces.sort(key=lambda s: s.row_offset)
    for s in pieces:
        if s.col_offset != 0 or s.cols != config.embedding_dim:
            fail(
                f"a row-wise shard of {table!r} holds columns {s.col_offset}:{s.col_offset + s.cols} "
                f"of {config.embedding_dim}",
                "a row-wise shard keeps whole rows: every column of its rows",
            )
    next_row = 0
    for s in pieces:
        if s.row_offset != next_row:
            fail(
                f"the shards of {table!r} do not cover its rows: rows {next_row}:{s.row_offset} are in no shard"
                if s.row_offset > next_row
                else f"the shards of {table!r} overlap at row {s.row_offset}",
                "every row must be in exactly one shard; let the planner cut the table rather than editing the plan",
            )
        next_row = s.row_offset + s.rows
    if next_row != config.num_embeddings:
        fail(
            f"the shards of {table!r} cover rows 0:{next_row} of its {config.num_embeddings}",
            "every row must be in exactly one shard",
        )
    ranks = [s.rank for s in pieces]
    if sorted(ranks) != list(range(world_size)):
        fail(
            f"for {what}, the row-wise shards of {table!r} sit on ranks {sorted(ranks)}",
            f"one shard on each of ranks 0..{world_size - 1}: plan on the topology you are given, not on a fixed one",
        )
    return [s.rows for s in pieces]


def _judge_others_left_alone(plan: Any, topology: Any, tables: Sequence[EmbeddingBagConfig], table: str, what: str) -> None:
    """The tables other than `table` are placed as the planner places them when only `table` is constrained."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints

    planner = EmbeddingShardingPlanner(topology=topology, constraints={table: ParameterConstraints(sharding_types=["row_wise"])})
    reference = planning._module_plan(planner.plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()]))
    mine = planning._module_plan(plan)
    def where(sharding: Any) -> tuple[str, list[int]]:
        return sharding.sharding_type, sorted(sharding.ranks or [])

    moved = [
        f"{name} ({mine[name].sharding_type} on ranks {where(mine[name])[1]}, the planner alone: "
        f"{sharding.sharding_type} on ranks {where(sharding)[1]})"
        for name, sharding in reference.items()
        if name != table and name in mine and where(mine[name]) != where(sharding)
    ]
    if moved:
        fail(
            f"for {what}, other tables are not where the planner puts them: {', '.join(moved)}",
            f"constrain {table!r} only, and leave the other tables to the planner",
        )


def _judge_shard_rows(shard_rows: Any, plan: Any, table: str, expected: list[int], what: str) -> None:
    from course_lib.checks import one_line, raise_if_unwritten

    answer, error = _call(shard_rows, "shard_rows", plan, table)
    if error is not None:
        fail(f"shard_rows raised {one_line(error)} on {what}", "read plan.plan[''][table].sharding_spec.shards")
    try:
        given = [int(n) for n in answer]
    except (TypeError, ValueError):
        fail(f"shard_rows must give a list of ints, got {answer!r}")
    if given != expected:
        offsets = list(itertools.accumulate([0] + expected[:-1]))
        hint = f"sort plan.plan[''][{table!r}].sharding_spec.shards by shard_offsets[0] and take each shard_sizes[0]"
        shards = plan.plan[""][table].sharding_spec.shards
        by_rank = [s.shard_sizes[0] for s in sorted(shards, key=lambda s: s.placement.rank())]
        block = -(-sum(expected) // len(expected))
        even = [min(block, sum(expected) - i * block) for i in range(len(expected))]
        if given == offsets:
            hint = f"those are the shards' first rows (shard_offsets[0]); the sizes are shard_sizes[0]. {hint}"
        elif given == by_rank:
            hint = f"those are in rank order: shard r need not hold the r-th block of rows. {hint}"
        elif given == even:
            hint = f"that is an even split worked out from the table's size; read the sizes the plan gives. {hint}"
        elif sorted(given) == sorted(expected):
            hint = f"right sizes, wrong order: the plan lists shards in no promised order. {hint}"
        fail(f"shard_rows gave {given} on {what}, but the shards of {table!r} have {expected} rows (in row order)", hint)


@exercise
def check_row_wise(
    row_wise_item_plan: Any,
    shard_rows: Any,
    tables: Sequence[EmbeddingBagConfig] = TABLES,
    *,
    table: str = "item",
) -> None:
    """`row_wise_item_plan(topology)` shards `table` row-wise over every rank of any topology, and
    `shard_rows(plan, table)` reads its shards' row counts in row order (also from a plan whose shards are
    listed out of order)."""
    import copy

    from course_lib.checks import one_line, raise_if_unwritten

    if not callable(row_wise_item_plan):
        fail(
            f"row_wise_item_plan must be a function of the topology, got a {type(row_wise_item_plan).__name__}",
            "pass the function itself: lab03.check_row_wise(row_wise_item_plan, shard_rows)",
        )
    if not callable(shard_rows):
        fail(f"shard_rows must be a function, got a {type(shard_rows).__name__}", "pass the function itself")
    topologies = [
        ("the cluster (2 hosts x 4 GPUs)", planning.topology(8, local_world_size=4, compute_device="cuda", hbm_cap_bytes=16 * 2**30)),
        ("2 hosts x 3 GPUs", planning.topology(6, local_world_size=3, compute_device="cuda", hbm_cap_bytes=16 * 2**30)),
        ("one host of 4 GPUs", planning.topology(4, local_world_size=4, compute_device="cuda", hbm_cap_bytes=16 * 2**30)),
    ]
    found, planned = [], []
    for what, topology in topologies:
        try:
            plan = checked_call("row_wise_item_plan", row_wise_item_plan, topology)
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (the learner's code: report it)
            raise_if_unwritten(error)
            fail(f"row_wise_item_plan raised {one_line(error)} for {what}", "plan with EmbeddingShardingPlanner(topology=topology, constraints=...)")
        expected = _judge_row_wise(plan, tables, table, topology.world_size, what)
        _judge_others_left_alone(plan, topology, tables, table, what)
        _judge_shard_rows(shard_rows, plan, table, expected, what)
        found.append((what, expected))
        shuffled = copy.deepcopy(plan)
        specs = shuffled.plan[""][table].sharding_spec.shards
        specs[:] = specs[len(specs) // 2 :][::-1] + specs[: len(specs) // 2]
        _judge_shard_rows(shard_rows, shuffled, table, expected, f"{what}, shards listed out of order")
        planned.append((what, plan, expected))
    for what, plan, expected in planned:
        # The same shards on the ranks in reverse order, and a plan cut unevenly (as another planner may cut it):
        # an answer that sorts by rank, or works the sizes out from the table's size, reads them wrong.
        placed = copy.deepcopy(plan)
        specs = placed.plan[""][table].sharding_spec.shards
        for spec, placement in zip(specs, [s.placement for s in specs][::-1]):
            spec.placement = placement
        _judge_shard_rows(shard_rows, placed, table, expected, f"{what}, shards placed on the ranks in reverse order")
        uneven = copy.deepcopy(plan)
        specs = sorted(uneven.plan[""][table].sharding_spec.shards, key=lambda s: s.shard_offsets[0])
        moved = specs[0].shard_sizes[0] // 4
        specs[0].shard_sizes[0] -= moved
        specs[1].shard_offsets[0] -= moved
        specs[1].shard_sizes[0] += moved
        uneven_rows = [expected[0] - moved, expected[1] + moved, *expected[2:]]
        _judge_shard_rows(shard_rows, uneven, table, uneven_rows, f"{what}, cut unevenly ({uneven_rows[:2]} rows first)")
        # Another table cut by rows in the same plan: shard_rows reads the table it is asked about.
        others = [s for s in planning.shards(plan, tables) if s.table != table and s.sharding_type in ("row_wise", "table_row_wise")]
        for other in sorted({s.table for s in others}):
            rows = [s.rows for s in sorted((s for s in others if s.table == other), key=lambda s: s.row_offset)]
            _judge_shard_rows(shard_rows, plan, other, rows, f"{what}, table {other!r}")
    config = next(t for t in tables if t.name == table)
    texts = []
    for what, rows in found:  # each topology by name: the pass line says where each cut was made
        sizes = sorted(set(rows))
        cut = f"{len(rows)} shards of {sizes[0]} rows" if len(sizes) == 1 else f"shards of {rows} rows"
        texts.append(f"{cut} on {what}")
    passed(
        f"{table!r} is row-wise over every rank, and its shards cover all {config.num_embeddings} rows "
        f"x {config.embedding_dim} once: {', '.join(texts)}; shard_rows reads them in row order"
    )


def _true_hosts(plan: Any, ranks_per_host: int) -> dict[str, set[int]]:
    return {
        name: {int(r) // ranks_per_host for r in (sharding.ranks or [])}
        for name, sharding in planning._module_plan(plan).items()
    }


def _as_hosts(value: Any) -> set[int] | None:
    try:
        hosts = {int(h) for h in value}
    except (TypeError, ValueError):
        return None
    if any(isinstance(h, bool) for h in value):
        return None
    return hosts


def _judge_hosts_of(hosts_of: Any, plan: ShardingPlan, ranks_per_host: int, what: str) -> None:
    """`hosts_of(plan, ranks_per_host)` must give {table: the hosts holding any of its shards} for `plan`."""
    from course_lib.checks import one_line, raise_if_unwritten

    got, error = _call(hosts_of, "hosts_of", plan, ranks_per_host)
    if error is not None:
        hint = "read each table's ParameterSharding.ranks: every sharding type fills it"
        if isinstance(error, AttributeError) and "NoneType" in str(error):
            hint = (
                "a data_parallel table has no sharding_spec (it is None): its copies are listed in "
                "ParameterSharding.ranks, which every sharding type fills"
            )
        fail(f"hosts_of raised {one_line(error)} on {what}", hint)
    want = _true_hosts(plan, ranks_per_host)
    if not isinstance(got, Mapping):
        fail(f"hosts_of returned a {type(got).__name__} on {what}", "return a dict {table name: the hosts that hold it}")
    missing = [name for name in want if name not in got]
    if missing:
        types = {name: s.sharding_type for name, s in planning._module_plan(plan).items()}
        fail(
            f"hosts_of left out {', '.join(f'{m!r} ({types[m]})' for m in missing)} on {what}",
            "every table lives somewhere; a data_parallel table lives on every rank (ParameterSharding.ranks)",
        )
    for name, hosts in want.items():
        given = _as_hosts(got[name])
        if given is None:
            fail(f"hosts_of gave {got[name]!r} for {name!r} on {what}", "give each table a set (or list) of host numbers")
        if given != hosts:
            ranks = sorted(planning._module_plan(plan)[name].ranks or [])
            hint = f"{name!r} sits on ranks {ranks}; with {ranks_per_host} ranks per host, rank r is on host r // {ranks_per_host}"
            if planning._module_plan(plan)[name].sharding_type == "data_parallel":
                hint = f"a data_parallel table has a full copy on every rank, so on every host: {hint}"
            elif given == {r % ranks_per_host for r in ranks}:
                hint = f"rank % ranks_per_host is the rank's place inside its host (LOCAL_RANK), not its host: {hint}"
            elif given == set(ranks) and given != hosts:
                hint = f"those are ranks, not hosts: {hint}"
            fail(f"hosts_of says {name!r} is on hosts {sorted(given)}, but it is on hosts {sorted(hosts)} ({what})", hint)


@exercise
def check_steering(
    constraints: Any,
    hosts_of: Any,
    *,
    tables: Sequence[EmbeddingBagConfig] = TABLES,
    budget_bytes: int = STEER_BUDGET_BYTES,
    table: str = STEER_TABLE,
) -> None:
    """The planner, steered by `constraints` alone (a dict, or a function that returns one), keeps every rank within `budget_bytes` of parameters and
    `table` on one host; `hosts_of(plan, ranks_per_host)` reads the hosts off that plan and off fresh ones (one of
    them a hand plan with a table on hosts 0 and 2 only)."""
    from torchrec.distributed.planner import ParameterConstraints

    from course_lib.checks import one_line, raise_if_unwritten

    if callable(constraints):  # steering_constraints(): the learner's decision, as a function
        try:
            constraints = constraints()
        except Exception as error:  # noqa: BLE001  (the learner's code: report it)
            raise_if_unwritten(error)
            fail(f"steering_constraints() raised {one_line(error)}", "return {table name: ParameterConstraints(...)}")
    if not callable(hosts_of):
        fail(f"hosts_of must be a function, got a {type(hosts_of).__name__}", "def hosts_of(plan, ranks_per_host): ...")
    if isinstance(constraints, ShardingPlan) or (
        isinstance(constraints, Mapping) and any(hasattr(v, "sharding_type") for v in constraints.values())
    ):
        fail(
            "that is a plan, not constraints",
            "the exercise steers the planner: give {table name: ParameterConstraints(...)} and let the planner place the shards",
        )
    if not isinstance(constraints, Mapping):
        fail(f"constraints must be a dict {{table name: ParameterConstraints}}, got a {type(constraints).__name__}")
    names = [t.name for t in tables]
    unknown = [n for n in constraints if n not in names]
    if unknown:
        fail(f"constraints name tables that do not exist: {unknown}", f"the tables are {names}; the planner would ignore the rest")
    for name, value in constraints.items():
        if not isinstance(value, ParameterConstraints):
            fail(f"the constraint for {name!r} is a {type(value).__name__}", "ParameterConstraints(sharding_types=[...], ...)")
    try:
        plan = steer_plan(constraints, tables)
    except Exception as error:  # noqa: BLE001  (the planner refused the constraints: say why)
        fail(f"the planner could not plan under these constraints: {one_line(error)}", "loosen the constraints it names")
    world, per_host = STEER_WORLD_SIZE, STEER_RANKS_PER_HOST
    kinds = {name: s.sharding_type for name, s in planning._module_plan(plan).items()}
    hosts = _true_hosts(plan, per_host)
    if len(hosts[table]) != 1:
        why = {
            "data_parallel": "data_parallel puts a full copy on every rank, and each rank looks up its own batch there",
            "row_wise": "row_wise cuts the rows over every rank of every host",
            "grid_shard": "grid_shard spreads column slices over the hosts",
        }.get(kinds[table], f"its shards sit on ranks {sorted(planning._module_plan(plan)[table].ranks or [])}")
        hint = f"{why}; table_row_wise keeps a table's rows on the ranks of one host"
        if table not in constraints:
            hint = f"you left {table!r} to the planner, and it chose {kinds[table]}: {hint}"
        fail(f"{table!r} is {kinds[table]}, on hosts {sorted(hosts[table])}: its lookups cross hosts", hint)
    per_rank = planning.bytes_per_rank(plan, tables, world)
    totals = per_rank.loc["total"].tolist()
    worst = max(range(world), key=lambda r: totals[r])
    if totals[worst] > budget_bytes:
        held = ", ".join(
            f"{name} {kinds[name]} {_kib(per_rank.loc[name, worst])}"
            for name in names
            if per_rank.loc[name, worst] > 0
        )
        hint = "a table cut over more ranks (row_wise, column_wise with a small min_partition) weighs less on each"
        over = totals[worst] - budget_bytes
        # only a copy heavy enough to cover the overshoot is worth naming: constraining a 4 KiB table cannot save 60
        copies = [n for n in names if kinds[n] == "data_parallel" and n not in constraints and per_rank.loc[n, worst] >= over]
        if copies:
            hint = f"the planner made {copies} data_parallel, a full copy on every rank; constrain them too. {hint}"
        fail(
            f"rank {worst} holds {_kib(totals[worst])} ({held}), over the {_kib(budget_bytes)} budget",
            hint,
        )
    _judge_hosts_of(hosts_of, plan, per_host, "your plan")
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    cluster = planning.topology(8, local_world_size=4, compute_device="cuda", hbm_cap_bytes=16 * 2**30)
    fresh = EmbeddingShardingPlanner(topology=cluster).plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    _judge_hosts_of(hosts_of, fresh, 4, "the planner's own plan for 2 hosts x 4 GPUs")
    spread = steer_plan({table: ParameterConstraints(sharding_types=["row_wise"])}, tables)
    _judge_hosts_of(hosts_of, spread, per_host, f"a plan with {table!r} row-wise")
    # 3 hosts: a row-wise table on a middle host too, and a data-parallel copy on every host, not just on 0 and 1.
    smallest = min(tables, key=lambda t: t.num_embeddings).name
    wide = EmbeddingShardingPlanner(
        topology=planning.topology(6, local_world_size=2, compute_device="cuda", hbm_cap_bytes=16 * 2**30),
        constraints={
            table: ParameterConstraints(sharding_types=["row_wise"]),
            smallest: ParameterConstraints(sharding_types=["data_parallel"]),
        },
    ).plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    _judge_hosts_of(hosts_of, wide, 2, f"a plan on 3 hosts x 2 GPUs ({table!r} row-wise, {smallest!r} data-parallel)")
    # A table on hosts 0 and 2 but not on host 1 (two column shards, on ranks 0 and 4): an answer that fills in
    # every host from the first rank's to the last rank's is right only while a table's hosts are consecutive.
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, table_wise

    names_by_size = [t.name for t in sorted(tables, key=lambda t: -t.num_embeddings)]
    gapped = planning.hand_plan(
        tables,
        {names_by_size[0]: column_wise(ranks=[0, 4]), **{n: table_wise(rank=r) for n, r in zip(names_by_size[1:-1], (3, 5))},
         **{n: data_parallel() for n in names_by_size[len(names_by_size) - 1:]}},
        world_size=6, local_world_size=2, device_type="cuda",
    )
    _judge_hosts_of(hosts_of, gapped, 2, f"a plan on 3 hosts x 2 GPUs with {names_by_size[0]!r} column-wise on ranks 0 and 4")
    passed(
        f"{table!r} is {kinds[table]} on host {min(hosts[table])} only; the busiest rank holds "
        f"{_kib(totals[worst])} <= {_kib(budget_bytes)}; hosts_of reads this plan and four others right"
    )
