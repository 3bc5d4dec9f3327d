"""Plan embedding tables across ranks, and read a plan: topologies, hand plans, tables, bytes per rank, pictures.

TorchRec's planner (``EmbeddingShardingPlanner``) and its plan helpers
(``torchrec.distributed.sharding_plan.construct_module_sharding_plan``) are used as they are; this module
only builds their inputs the way torchrec 1.8 asks, and turns a ``ShardingPlan`` into things a person reads:

    topo = planning.topology(world_size=2)                    # TopologyFactory, no warnings
    plan = EmbeddingShardingPlanner(topology=topo).plan(planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])
    planning.plan_table(plan, tables)                         # one row per table
    planning.shard_table(plan, tables)                        # one row per shard
    planning.bytes_per_rank(plan, tables, world_size=2)       # table x rank, parameter bytes
    planning.plot_shards(plan, tables)                        # each table cut into its shards, coloured by rank
    planning.plot_memory({"planner": plan}, tables, 2)        # stacked bytes per rank

Sizes are the tables' parameters (rows x dim x bytes per element). The planner's own storage estimate adds
optimizer state, kernel workspace and input/output buffers; for the plans of these labs (fused SGD, tiny
batches) parameters are what differ between ranks.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints
from torchrec.distributed.planner.types import KernelConfig, Topology, TopologyFactory, TrainerConfig
from torchrec.distributed.sharding_plan import construct_module_sharding_plan
from torchrec.distributed.types import ShardingPlan, ShardingType
from torchrec.modules.embedding_configs import data_type_to_dtype

if TYPE_CHECKING:
    import pandas
    from matplotlib.figure import Figure

__all__ = [
    "Estimates",
    "Shard",
    "byte_unit",
    "bytes_per_rank",
    "hand_plan",
    "memory_spread",
    "meta_ebc",
    "module_plan",
    "one_type_plan",
    "plan_table",
    "plot_memory",
    "plot_shards",
    "shard_table",
    "shards",
    "table_plan",
    "topology",
]

PLANNER_SHARDING_TYPES = ("table_wise", "column_wise", "data_parallel", "table_column_wise")


# ------------------------------------------------------------------------------------- building plans


def topology(
    world_size: int,
    *,
    compute_device: str = "cpu",
    local_world_size: int | None = None,
    hbm_cap_bytes: int | None = None,
    ddr_cap_bytes: int | None = None,
) -> Topology:
    """The hardware a plan is made for, built through ``TopologyFactory.create_topology`` as torchrec 1.8 asks.

    `local_world_size` is the number of ranks per host (default: all on one host); `compute_device` is
    "cpu" or "cuda" (a CUDA topology can be planned on a laptop: nothing runs on it). Caps are per rank.
    """
    return TopologyFactory.create_topology(
        trainer_config=TrainerConfig(
            world_size=world_size,
            local_world_size=local_world_size or world_size,
            hbm_cap_bytes=hbm_cap_bytes,
            ddr_cap_bytes=ddr_cap_bytes,
        ),
        kernel_config=KernelConfig(compute_device=compute_device),
    )


def meta_ebc(tables: Sequence[EmbeddingBagConfig]) -> EmbeddingBagCollection:
    """An EmbeddingBagCollection of `tables` on the meta device: shapes only, what planners and DMP take."""
    return EmbeddingBagCollection(tables=list(tables), device=torch.device("meta"))


class _DropMissingSpecNotice(logging.Filter):
    """Drops the planner's root-logger notice "Sharding spec not found for .<table>".

    torchrec logs it (``logging.warning`` on the root logger, so it reaches a notebook as
    "WARNING:root:...") for every data-parallel table of every plan; a data-parallel table has no shards
    by design, so there is nothing to act on. Installed on the root logger when this module is imported.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.name == "root" and record.getMessage().startswith("Sharding spec not found for "))


def _install_notice_filter() -> None:
    root = logging.getLogger()
    if not any(isinstance(f, _DropMissingSpecNotice) for f in root.filters):
        root.addFilter(_DropMissingSpecNotice())


_install_notice_filter()


def module_plan(
    ebc: EmbeddingBagCollection,
    per_table: Mapping[str, Any],
    *,
    world_size: int,
    local_world_size: int | None = None,
    device_type: str = "cpu",
    sharder: EmbeddingBagCollectionSharder | None = None,
) -> Any:
    """The plan of one EBC written by hand: ``construct_module_sharding_plan`` after checking that
    `per_table` names every table of `ebc` exactly once (torchrec would skip a table that it does not name).

    `per_table` maps every table name to a generator from ``torchrec.distributed.sharding_plan``
    (``table_wise(rank=1)``, ``row_wise()``, ``column_wise(ranks=[0, 1])``, ``data_parallel()``, ...).
    """
    names = [config.name for config in ebc.embedding_bag_configs()]
    if sorted(per_table) != sorted(names):
        missing, extra = sorted(set(names) - set(per_table)), sorted(set(per_table) - set(names))
        raise ValueError(
            f"per_table must name every table exactly once: tables are {names}; missing {missing}, unknown {extra}"
        )
    return construct_module_sharding_plan(
        ebc,
        dict(per_table),
        sharder=sharder or EmbeddingBagCollectionSharder(),
        local_size=local_world_size or world_size,
        world_size=world_size,
        device_type=device_type,
    )


def hand_plan(
    tables: Sequence[EmbeddingBagConfig],
    per_table: Mapping[str, Any],
    *,
    world_size: int,
    local_world_size: int | None = None,
    device_type: str = "cpu",
    sharder: EmbeddingBagCollectionSharder | None = None,
) -> ShardingPlan:
    """A plan written by hand, for a DistributedModelParallel that wraps an EBC of `tables` directly.

    `module_plan` on a meta EBC of `tables`, wrapped in a ``ShardingPlan`` under the module path ""
    (the EBC is the wrapped module itself). For an EBC inside a model, ``training.model_plan``.
    """
    names = [t.name for t in tables]
    ordered = {name: per_table[name] for name in names if name in per_table} | dict(per_table)
    plan = module_plan(
        meta_ebc(tables),
        ordered,
        world_size=world_size,
        local_world_size=local_world_size,
        device_type=device_type,
        sharder=sharder,
    )
    return ShardingPlan({"": plan})


def table_plan(
    tables: Sequence[EmbeddingBagConfig], assignment: Mapping[str, int], *, world_size: int, device_type: str = "cpu"
) -> ShardingPlan:
    """A table-wise hand plan: table `name` lives whole on rank `assignment[name]`."""
    from torchrec.distributed.sharding_plan import table_wise

    return hand_plan(
        tables,
        {name: table_wise(rank=rank) for name, rank in assignment.items()},
        world_size=world_size,
        device_type=device_type,
    )


def one_type_plan(
    tables: Sequence[EmbeddingBagConfig],
    sharding_type: str,
    *,
    world_size: int,
    min_partition: int | None = None,
    process_group: Any = None,
) -> ShardingPlan:
    """Every table sharded one way, on a CPU topology of `world_size` ranks.

    Table-wise, column-wise, table-column-wise and data-parallel plans come from the planner, constrained
    to that sharding type (`min_partition`: the narrowest column-wise shard, default half the smallest
    dim). Row-wise comes from a hand plan, since the planner does not offer it on CPU (the sharding itself
    runs there). With a `process_group`, the planner plans on rank 0 and broadcasts the plan
    (``collective_plan``), as every rank of a job must use the same plan.
    """
    sharding_type = ShardingType(sharding_type).value
    if sharding_type == ShardingType.ROW_WISE.value:
        from torchrec.distributed.sharding_plan import row_wise

        return hand_plan(tables, {t.name: row_wise(compute_kernel="fused") for t in tables}, world_size=world_size)
    if sharding_type not in PLANNER_SHARDING_TYPES:
        raise ValueError(
            f"{sharding_type!r} cannot be planned on a CPU topology; choose one of "
            f"{PLANNER_SHARDING_TYPES + ('row_wise',)} (plan the others on a topology(compute_device='cuda'))"
        )
    if min_partition is None:
        min_partition = max(1, min(t.embedding_dim for t in tables) // 2)
    constraints = {
        t.name: ParameterConstraints(sharding_types=[sharding_type], min_partition=min_partition) for t in tables
    }
    planner = EmbeddingShardingPlanner(topology=topology(world_size), constraints=constraints)
    sharders = [EmbeddingBagCollectionSharder()]
    if process_group is not None:
        return planner.collective_plan(meta_ebc(tables), sharders, process_group)
    return planner.plan(meta_ebc(tables), sharders)


class Estimates:
    """A planner callback that keeps the planner's own estimates for the plan it chose.

        estimates = planning.Estimates()
        plan = EmbeddingShardingPlanner(topology=topo, callbacks=[estimates]).plan(ebc, sharders)
        estimates.table()      # per shard: estimated time per step (ms) and storage (KiB)

    ``callbacks`` is the planner's public hook: each is called with the chosen ``ShardingOption``s.
    Times are the planner's perf model (lookup compute and communication at the topology's bandwidths,
    for its default batch size), in milliseconds; storage includes the planner's allowance for
    input/output buffers, and optimizer state only for a table whose optimizer the planner was told of
    (``apply_optimizer_in_backward`` records it; fused_params alone do not), so it is more than the
    parameter bytes.
    """

    def __init__(self) -> None:
        self.options: list[Any] = []

    def __call__(self, best_plan: list[Any]) -> list[Any]:
        self.options = list(best_plan)
        return best_plan

    def per_rank(self, world_size: int) -> tuple[list[float], list[float]]:
        """``(HBM GiB, communication ms per step)`` of each rank: its shards' storage and forward + backward comms."""
        hbm, comms = [0.0] * world_size, [0.0] * world_size
        for option in self.options:
            for shard in option.shards:
                hbm[shard.rank] += shard.storage.hbm / 2**30
                comms[shard.rank] += shard.perf.fwd_comms + shard.perf.bwd_comms
        return hbm, comms

    def table(self) -> "pandas.DataFrame":
        """One row per shard the planner placed: table, sharding type, rank, est. ms per step, est. KiB."""
        import pandas as pd

        rows = [
            {
                "table": option.name,
                "sharding type": option.sharding_type,
                "rank": shard.rank,
                "est. ms per step": round(shard.perf.total, 4),
                "est. KiB": round((shard.storage.hbm + shard.storage.ddr) / 1024, 1),
            }
            for option in self.options
            for shard in option.shards
        ]
        return pd.DataFrame(rows, columns=["table", "sharding type", "rank", "est. ms per step", "est. KiB"])


# -------------------------------------------------------------------------------------- reading plans


@dataclass(frozen=True)
class Shard:
    """One piece of one table on one rank. A data-parallel table has one full-size replica per rank."""

    table: str
    sharding_type: str
    compute_kernel: str
    rank: int
    row_offset: int
    rows: int
    col_offset: int
    cols: int
    bytes: int


def _module_plan(plan: ShardingPlan | Mapping[str, Any]) -> Mapping[str, Any]:
    """The per-table plan of the one EBC in `plan` (a ShardingPlan or an EmbeddingModuleShardingPlan)."""
    if isinstance(plan, ShardingPlan):
        embedding_plans = [p for p in plan.plan.values() if isinstance(p, Mapping)]
        if len(embedding_plans) != 1:
            raise ValueError(f"expected a plan for one embedding module, got modules {list(plan.plan)}")
        return embedding_plans[0]
    return plan


def _bytes_per_element(table: EmbeddingBagConfig | None) -> int:
    if table is None:
        return 4
    return torch.empty((), dtype=data_type_to_dtype(table.data_type)).element_size()


def shards(
    plan: ShardingPlan | Mapping[str, Any], tables: Sequence[EmbeddingBagConfig] | None = None, world_size: int | None = None
) -> list[Shard]:
    """Every shard of `plan`, table by table, in the plan's order.

    `tables` gives the bytes per element and the size of data-parallel tables (which have no shard
    metadata); `world_size` is needed only when a data-parallel table's ranks are not listed.
    """
    configs = {t.name: t for t in tables or []}
    out: list[Shard] = []
    for name, sharding in _module_plan(plan).items():
        config = configs.get(name)
        per_element = _bytes_per_element(config)
        if sharding.sharding_spec is None:  # data_parallel: a full replica on every rank
            if config is None:
                raise ValueError(f"table {name!r} is {sharding.sharding_type}: pass `tables` to know its size")
            ranks = sharding.ranks or list(range(world_size or 0))
            rows, cols = config.num_embeddings, config.embedding_dim
            out += [
                Shard(name, sharding.sharding_type, sharding.compute_kernel, r, 0, rows, 0, cols, rows * cols * per_element)
                for r in ranks
            ]
            continue
        for meta in sharding.sharding_spec.shards:
            (row_offset, col_offset), (rows, cols) = meta.shard_offsets, meta.shard_sizes
            out.append(
                Shard(
                    name,
                    sharding.sharding_type,
                    sharding.compute_kernel,
                    meta.placement.rank(),
                    row_offset,
                    rows,
                    col_offset,
                    cols,
                    rows * cols * per_element,
                )
            )
    return out


def _ranks_text(ranks: Sequence[int]) -> str:
    ranks = sorted(set(ranks))
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


def plan_table(
    plan: ShardingPlan | Mapping[str, Any], tables: Sequence[EmbeddingBagConfig] | None = None
) -> "pandas.DataFrame":
    """One row per table: its sharding type, compute kernel, ranks, and shard shapes (rows x cols)."""
    import pandas as pd

    by_table: dict[str, list[Shard]] = {}
    for shard in shards(plan, tables):
        by_table.setdefault(shard.table, []).append(shard)
    rows = []
    for name, pieces in by_table.items():
        shapes = sorted({(s.rows, s.cols) for s in pieces}, reverse=True)
        shape_text = ", ".join(f"{r} x {c}" for r, c in shapes)
        rows.append(
            {
                "table": name,
                "sharding type": pieces[0].sharding_type,
                "kernel": pieces[0].compute_kernel,
                "shards": len(pieces),
                "shard shape": shape_text,
                "ranks": _ranks_text([s.rank for s in pieces]),
            }
        )
    return pd.DataFrame(rows, columns=["table", "sharding type", "kernel", "shards", "shard shape", "ranks"]).set_index("table")


def shard_table(
    plan: ShardingPlan | Mapping[str, Any], tables: Sequence[EmbeddingBagConfig] | None = None
) -> "pandas.DataFrame":
    """One row per shard: table, sharding type, rank, rows and columns it covers, bytes."""
    import pandas as pd

    rows = [
        {
            "table": s.table,
            "sharding type": s.sharding_type,
            "rank": s.rank,
            "rows": f"{s.row_offset}:{s.row_offset + s.rows}",
            "cols": f"{s.col_offset}:{s.col_offset + s.cols}",
            "bytes": s.bytes,
        }
        for s in shards(plan, tables)
    ]
    return pd.DataFrame(rows, columns=["table", "sharding type", "rank", "rows", "cols", "bytes"])


def bytes_per_rank(
    plan: ShardingPlan | Mapping[str, Any], tables: Sequence[EmbeddingBagConfig] | None, world_size: int
) -> "pandas.DataFrame":
    """Parameter bytes held by each of `world_size` ranks, table by table: a table x rank frame with a "total" row.

    `world_size` is needed because a plan only names the ranks that hold something: an empty rank counts.
    """
    import pandas as pd

    pieces = shards(plan, tables, world_size)
    if any(s.rank >= world_size for s in pieces):
        raise ValueError(f"the plan places shards on ranks up to {max(s.rank for s in pieces)}, beyond world_size={world_size}")
    world = world_size
    names = list(dict.fromkeys(s.table for s in pieces))
    frame = pd.DataFrame(0, index=names, columns=list(range(world)), dtype="int64")
    for s in pieces:
        frame.loc[s.table, s.rank] += s.bytes
    frame.loc["total"] = frame.sum(axis=0)
    frame.columns.name = "rank"
    return frame


def memory_spread(
    plan: ShardingPlan | Mapping[str, Any], tables: Sequence[EmbeddingBagConfig] | None, world_size: int
) -> float:
    """(most loaded rank - least loaded rank) / mean, over the per-rank parameter bytes of `world_size` ranks.

    0 is a perfect balance; 2.0 on two ranks means one rank holds everything.
    """
    totals = bytes_per_rank(plan, tables, world_size).loc["total"]
    mean = float(totals.mean())
    return 0.0 if mean == 0 else float(totals.max() - totals.min()) / mean


# ---------------------------------------------------------------------------------------------- pictures

_TABLE_COLOURS = ("#8dd3c7", "#fdb462", "#bebada", "#fb8072", "#80b1d3", "#b3de69", "#fccde5", "#bc80bd")


def plot_shards(
    plan: ShardingPlan | Mapping[str, Any],
    tables: Sequence[EmbeddingBagConfig],
    *,
    ranks_per_host: int | None = None,
    title: str | None = None,
) -> "Figure":
    """Each table drawn as a block (rows down, columns across) cut into its shards, coloured by rank.

    Every table gets the same height whatever its row count, so the cuts are what you compare; the row
    count is in its label. A data-parallel table is one hatched block: every rank holds all of it. With
    `ranks_per_host`, each shard also names its host (rank // ranks_per_host).
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from course_lib.viz import rank_colour

    configs = {t.name: t for t in tables}
    pieces = shards(plan, tables)
    names = list(dict.fromkeys(s.table for s in pieces))
    fig, axes = plt.subplots(1, len(names), figsize=(1.45 * len(names) + 0.6, 2.9), squeeze=False)
    for ax, name in zip(axes[0], names):
        config = configs[name]
        rows, cols = config.num_embeddings, config.embedding_dim
        mine = [s for s in pieces if s.table == name]
        ax.set_xlim(0, 1)
        ax.set_ylim(1, 0)
        ax.set_axis_off()
        ax.set_title(f"{name}\n{rows} x {cols}\n{mine[0].sharding_type}", fontsize=8)
        if mine[0].sharding_type == ShardingType.DATA_PARALLEL.value:
            ax.add_patch(Rectangle((0, 0), 1, 1, facecolor="#dddddd", hatch="//", edgecolor="white", gid="replica"))
            ax.text(0.5, 0.5, "every\nrank", ha="center", va="center", fontsize=8)
            continue
        for s in mine:
            x, y = s.col_offset / cols, s.row_offset / rows
            w, h = s.cols / cols, s.rows / rows
            ax.add_patch(Rectangle((x, y), w, h, facecolor=rank_colour(s.rank), edgecolor="white", lw=1.2, gid="shard"))
            if h > 0.05 and w > 0.12:
                label = f"r{s.rank}" if not ranks_per_host else f"r{s.rank} h{s.rank // ranks_per_host}"
                ax.text(x + w / 2, y + h / 2, label, ha="center", va="center", fontsize=7, color="white")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    plt.close(fig)
    return fig


_BYTE_UNITS = {"B": 1, "KiB": 1024, "MiB": 1024**2, "GiB": 1024**3}


def byte_unit(n_bytes: float) -> str:
    """The largest of B, KiB, MiB, GiB in which ``n_bytes`` is at least 1 (``byte_unit(3 * 2**20) == "MiB"``)."""
    for unit in ("GiB", "MiB", "KiB"):
        if n_bytes >= _BYTE_UNITS[unit]:
            return unit
    return "B"


def plot_memory(
    plans: Mapping[str, ShardingPlan | Mapping[str, Any]] | ShardingPlan,
    tables: Sequence[EmbeddingBagConfig],
    world_size: int,
    *,
    unit: str | None = None,
) -> "Figure":
    """Parameter bytes per rank, stacked by table; one panel per plan (``{"label": plan}``), same scale.

    ``unit`` ("B", "KiB", "MiB", "GiB") defaults to the largest one in which the fullest rank holds at least 1.
    """
    import matplotlib.pyplot as plt

    if isinstance(plans, ShardingPlan):
        plans = {"plan": plans}
    names = [t.name for t in tables]
    colours = {name: _TABLE_COLOURS[i % len(_TABLE_COLOURS)] for i, name in enumerate(names)}
    raw = {label: bytes_per_rank(plan, tables, world_size).drop(index="total") for label, plan in plans.items()}
    unit = unit or byte_unit(max(float(f.sum(axis=0).max()) for f in raw.values()))
    scale = _BYTE_UNITS[unit]
    frames = {label: frame / scale for label, frame in raw.items()}
    top = max(float(f.sum(axis=0).max()) for f in frames.values()) * 1.12
    # A panel widens with the ranks (64 bars need room); the legend takes as many rows as its tables need.
    panel_width = max(2.4, 0.085 * world_size)
    width = panel_width * len(frames) + 0.8
    columns = max(1, min(len(names), int(width / 0.8)))
    legend_rows = -(-len(names) // columns)
    legend_height = 0.18 * legend_rows + 0.1
    height = 2.8 + legend_height
    fig, axes = plt.subplots(1, len(frames), figsize=(width, height), squeeze=False, sharey=True)
    for ax, (label, frame) in zip(axes[0], frames.items()):
        bottom = [0.0] * frame.shape[1]
        for name in frame.index:
            heights = frame.loc[name].tolist()
            ax.bar(range(frame.shape[1]), heights, bottom=bottom, color=colours.get(name, "#999999"), label=name,
                   edgecolor="white", linewidth=0.8 if frame.shape[1] <= 16 else 0.3,  # a line between stacked tables
                   width=0.8 if frame.shape[1] <= 16 else 0.9, gid="segment")
            bottom = [b + h for b, h in zip(bottom, heights)]
        mean = sum(bottom) / len(bottom)
        spread = 0.0 if mean == 0 else (max(bottom) - min(bottom)) / mean
        ax.set_title(f"{label}\nspread {spread:.0%}", fontsize=8)
        if frame.shape[1] <= 8:
            ax.set_xticks(range(frame.shape[1]), [f"rank {r}" for r in frame.columns], fontsize=7)
        else:  # many ranks: numbers only, and only as many as fit
            step = max(1, frame.shape[1] // 8)
            ax.set_xticks(range(0, frame.shape[1], step), [str(r) for r in frame.columns[::step]], fontsize=7)
            ax.set_xlabel("rank", fontsize=8)
        ax.set_ylim(0, top)
        ax.grid(axis="x", visible=False)
    axes[0][0].set_ylabel(f"parameters ({unit})", fontsize=8)
    handles, labels = axes[0][-1].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=columns, fontsize=7, frameon=False)
    fig.tight_layout(rect=(0, legend_height / height, 1, 1))
    plt.close(fig)
    return fig
