"""Checks for 03_sharding: constrain a plan to row-wise and read its shards; balance per-rank memory by hand."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from torchrec import EmbeddingBagConfig
from torchrec.distributed.types import ShardingPlan

from course_lib import planning
from course_lib.checks import exercise, fail, passed


def _tables(spec: Sequence[tuple[str, int]], dim: int = 16) -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[f"{name}_id"])
        for name, rows in spec
    ]


# Exercise 2: five tables whose greedy placement (largest first, onto the emptiest rank) is 17 : 13.
BALANCE_TABLES: list[EmbeddingBagConfig] = _tables(
    [("query", 8000), ("doc", 7000), ("author", 6000), ("site", 5000), ("topic", 4000)]
)
BALANCE_WORLD_SIZE = 2
BALANCE_TOLERANCE = 0.05  # (most loaded - least loaded rank) / mean


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB"


@exercise
def check_row_wise(
    plan: Any,
    shard_rows: Any,
    tables: Sequence[EmbeddingBagConfig],
    *,
    table: str = "item",
    world_size: int = 8,
) -> None:
    """`plan` shards `table` row-wise, its shards cover every row once, and `shard_rows` lists their row counts."""
    if not isinstance(plan, ShardingPlan):
        fail(f"the plan is a {type(plan).__name__}, not a ShardingPlan", "return what planner.plan(...) returns")
    config = next((t for t in tables if t.name == table), None)
    if config is None:
        fail(f"no table named {table!r} among the tables given to the check")
    try:
        pieces = [s for s in planning.shards(plan, tables) if s.table == table]
    except ValueError as exc:
        fail(f"cannot read the plan: {exc}")
    if not pieces:
        fail(f"the plan has no entry for table {table!r}", "plan the EBC of all the lab's tables (planning.meta_ebc(TABLES))")
    kind = pieces[0].sharding_type
    if kind != "row_wise":
        hint = (
            "table_row_wise is row-wise inside one host only; ask for 'row_wise' to spread the rows over every rank"
            if kind == "table_row_wise"
            else f"pass constraints={{{table!r}: ParameterConstraints(sharding_types=['row_wise'])}} to the planner"
        )
        fail(f"table {table!r} is sharded {kind}, not row_wise", hint)
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
    if len(set(ranks)) != len(ranks) or any(not 0 <= r < world_size for r in ranks):
        fail(f"the row-wise shards of {table!r} sit on ranks {ranks}", f"one shard per rank, ranks 0..{world_size - 1}")
    expected = [s.rows for s in pieces]
    try:
        given = [int(n) for n in shard_rows]
    except (TypeError, ValueError):
        fail(f"shard_rows must give a list of ints, got {shard_rows!r}")
    if given != expected:
        fail(
            f"shard_rows gave {given}, but the plan's shards of {table!r} have {expected} rows (in row order)",
            f"sort plan.plan[''][{table!r}].sharding_spec.shards by shard_offsets[0] and take each shard_sizes[0]",
        )
    sizes = sorted(set(expected))
    size_text = f"{len(expected)} shards of {sizes[0]} rows" if len(sizes) == 1 else f"shards of {expected} rows"
    passed(
        f"{table!r} is row-wise over {len(expected)} ranks: {size_text} x {config.embedding_dim} "
        f"cover all {config.num_embeddings} rows once"
    )


@exercise
def check_balanced(
    assignment: Any,
    *,
    tables: Sequence[EmbeddingBagConfig] = BALANCE_TABLES,
    world_size: int = BALANCE_WORLD_SIZE,
    tolerance: float = BALANCE_TOLERANCE,
) -> None:
    """`assignment` ({table: rank}) places every table whole on one rank, with per-rank bytes within `tolerance`."""
    names = [t.name for t in tables]
    if not isinstance(assignment, Mapping):
        fail(f"assignment must be a dict {{table name: rank}}, got a {type(assignment).__name__}")
    missing = [n for n in names if n not in assignment]
    if missing:
        fail(
            f"the assignment drops {', '.join(map(repr, missing))}",
            "every table must live somewhere: a plan that leaves a table out cannot run",
        )
    unknown = [n for n in assignment if n not in names]
    if unknown:
        fail(f"the assignment names tables that do not exist: {unknown}", f"the tables are {names}")
    for name, rank in assignment.items():
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            fail(f"table {name!r} is assigned to {rank!r}", f"a rank is an int from 0 to {world_size - 1}")
    plan = planning.table_plan(tables, dict(assignment), world_size=world_size)
    totals = planning.bytes_per_rank(plan, tables, world_size).loc["total"].tolist()
    spread = planning.memory_spread(plan, tables, world_size)
    per_rank = ", ".join(f"rank {r}: {_kib(b)}" for r, b in enumerate(totals))
    if spread > tolerance:
        fail(
            f"{per_rank}: spread {spread:.1%} is over the {tolerance:.0%} allowed",
            f"the tables add up to {_kib(sum(totals))}, so each rank should hold about {_kib(sum(totals) / world_size)}; "
            "largest-first onto the emptiest rank (the greedy way) does not get there: look for tables that sum to "
            "exactly half",
        )
    passed(f"every table placed once; {per_rank} (spread {spread:.1%} <= {tolerance:.0%})")
