"""Tables for ids that never stop arriving (lab 10): modulo hashing against TorchRec's managed collisions.

    sparse = collisions.hashed_ebc(tables)                       # row = raw id % num_embeddings
    sparse = collisions.zch_ebc(tables, "lru")                   # a ManagedCollisionEmbeddingBagCollection
    model = collisions.IdClickModel(sparse, num_dense=4)
    report = collisions.run_days(model, log)                     # train on day d, score day d+1, slide

Both kinds of module take a KeyedJaggedTensor of raw ids (any int64) and return pooled embeddings;
:func:`rows_of` says which row each id lands in, so collisions can be counted. ``zch_ebc`` builds the
managed-collision stack the lab shows cell by cell: one ``MCHManagedCollisionModule`` per table (a sorted
map from raw id to row, with an eviction policy), in a ``ManagedCollisionCollection``, in front of an
``EmbeddingBagCollection``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from course_lib import data

__all__ = [
    "EVICTION_POLICIES",
    "DayResult",
    "HashedEBC",
    "IdClickModel",
    "id_tables",
    "hashed_ebc",
    "miss_row",
    "reference_residents",
    "resident_ids",
    "rows_of",
    "run_days",
    "score_day",
    "shared_row_fraction",
    "sharded_residents",
    "train_day",
    "zch_ebc",
]

EVICTION_POLICIES = ("lru", "lfu", "distance_lfu")


def id_tables(rows: int | dict[str, int], embedding_dim: int = 8, features: Sequence[str] = ("user", "item")) -> list[EmbeddingBagConfig]:
    """One table per feature (``t_user``, ``t_item``), ``rows`` rows each (or per feature), with a small init."""
    sizes = rows if isinstance(rows, dict) else {f: rows for f in features}
    return [
        EmbeddingBagConfig(
            name=f"t_{f}", embedding_dim=embedding_dim, num_embeddings=sizes[f], feature_names=[f],
            init_fn=lambda w: nn.init.normal_(w, std=0.05),
        )
        for f in features
    ]


class HashedEBC(nn.Module):
    """An EmbeddingBagCollection behind the usual fix for unbounded ids: row = raw id % num_embeddings."""

    def __init__(self, tables: Sequence[EmbeddingBagConfig]) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=list(tables), device=torch.device("cpu"))
        self.rows = {f: t.num_embeddings for t in tables for f in t.feature_names}

    def remap(self, features: KeyedJaggedTensor) -> KeyedJaggedTensor:
        """The same features with each id replaced by its row."""
        per_key = features.to_dict()
        values = torch.cat([per_key[k].values() % self.rows[k] for k in features.keys()])
        return KeyedJaggedTensor(keys=features.keys(), values=values, lengths=features.lengths())

    def forward(self, features: KeyedJaggedTensor) -> Any:
        return self.ebc(self.remap(features))


def hashed_ebc(tables: Sequence[EmbeddingBagConfig]) -> HashedEBC:
    """Modulo hashing: unrelated ids share a row whenever ``id % rows`` agrees."""
    return HashedEBC(tables)


def _policy(name: str) -> Any:
    from torchrec.modules.mc_modules import DistanceLFU_EvictionPolicy, LFU_EvictionPolicy, LRU_EvictionPolicy

    policies = {"lru": LRU_EvictionPolicy, "lfu": LFU_EvictionPolicy, "distance_lfu": DistanceLFU_EvictionPolicy}
    if name not in policies:
        raise ValueError(f"eviction policy must be one of {', '.join(EVICTION_POLICIES)}, got {name!r}")
    return policies[name]()


def zch_ebc(
    tables: Sequence[EmbeddingBagConfig],
    policy: str = "lru",
    eviction_interval: int = 1,
    input_hash_size: int = 2**63 - 1,
) -> nn.Module:
    """A ManagedCollisionEmbeddingBagCollection: zero-collision hashing with ``policy`` eviction.

    Each table's ``MCHManagedCollisionModule`` keeps up to ``num_embeddings - 1`` ids, each in a row of its
    own; the last row is where every id goes that is not (or no longer) in the table. Ids are admitted and
    evicted while training, every ``eviction_interval`` batches; in eval mode the map is read only.
    ``input_hash_size`` is the range raw ids are expected in: sharded row-wise, it decides which rank's
    part of the table an id belongs to.
    """
    from torchrec.modules.mc_embedding_modules import ManagedCollisionEmbeddingBagCollection
    from torchrec.modules.mc_modules import ManagedCollisionCollection, MCHManagedCollisionModule

    tables = list(tables)
    modules = {
        t.name: MCHManagedCollisionModule(
            zch_size=t.num_embeddings, device=torch.device("cpu"), eviction_policy=_policy(policy),
            eviction_interval=eviction_interval, input_hash_size=input_hash_size,
        )
        for t in tables
    }
    return ManagedCollisionEmbeddingBagCollection(
        EmbeddingBagCollection(tables=tables, device=torch.device("cpu")),
        ManagedCollisionCollection(modules, tables),
        return_remapped_features=False,
    )


def _mch(module: nn.Module, feature: str) -> Any:
    mcc = module._managed_collision_collection
    return mcc._managed_collision_modules[mcc._feature_to_table[feature]]


def miss_row(module: nn.Module, feature: str) -> int | None:
    """The row every unknown id of ``feature`` lands in (``None`` for modulo hashing, which has none)."""
    if isinstance(module, HashedEBC):
        return None
    mch = _mch(module, feature)
    return int(mch._output_global_offset + mch._zch_size - 1)


def resident_ids(module: nn.Module, feature: str) -> dict[int, int]:
    """``{raw id: row}`` of the ids a managed-collision table holds now."""
    return _map_of(_mch(module, feature))


def _map_of(mch: Any) -> dict[int, int]:
    """``{raw id: row}`` held by one ``MCHManagedCollisionModule`` (empty slots hold int64's max)."""
    ids, rows = mch._mch_sorted_raw_ids, mch._mch_remapped_ids_mapping
    keep = ids != torch.iinfo(torch.int64).max
    return dict(zip(ids[keep].tolist(), rows[keep].tolist()))


@torch.no_grad()
def rows_of(module: nn.Module, feature: str, ids: torch.Tensor) -> torch.Tensor:
    """The row each raw id of ``feature`` lands in now, without changing the table (nothing is admitted)."""
    if isinstance(module, HashedEBC):
        return ids % module.rows[feature]
    mch = _mch(module, feature)
    sorted_ids, mapping = mch._mch_sorted_raw_ids, mch._mch_remapped_ids_mapping
    pos = torch.searchsorted(sorted_ids[:-1], ids)
    hit = sorted_ids[pos] == ids
    return torch.where(hit, mapping[pos], torch.full_like(ids, miss_row(module, feature)))


def shared_row_fraction(ids: torch.Tensor, rows: torch.Tensor) -> float:
    """The share of distinct ids whose row also serves another distinct id (the collision rate).

    ``ids[n]`` landed in ``rows[n]``; repeats of one id are one id.
    """
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    if pairs.shape[1] == 0:
        return 0.0
    _, per_row = torch.unique(pairs[1], return_counts=True)
    return float(per_row[per_row > 1].sum()) / pairs.shape[1]


class IdClickModel(nn.Module):
    """A click model over raw-id features: pooled user and item embeddings, their product, dense counts.

    ``logit = MLP([e_user * e_item, e_user, e_item, dense])``. ``sparse`` is any module that turns the KJT
    into pooled embeddings (an EBC, a :class:`HashedEBC`, a managed-collision EBC).
    """

    def __init__(self, sparse: nn.Module, num_dense: int, embedding_dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        self.sparse = sparse
        self.over = nn.Sequential(nn.Linear(3 * embedding_dim + num_dense, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def embeddings(self, features: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Pooled ``(e_user, e_item)`` of a batch."""
        out = self.sparse(features)
        pooled = (out[0] if isinstance(out, tuple) else out).to_dict()
        return pooled["user"], pooled["item"]

    def forward(self, features: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        user, item = self.embeddings(features)
        return self.over(torch.cat([user * item, user, item, dense], 1)).squeeze(1)


@dataclass
class DayResult:
    """What :func:`run_days` measured on one evaluation day (scored before the model trains on it)."""

    day: int
    auc: float
    bayes_auc: float
    new_item_auc: float | None
    item_collisions: float
    item_misses: float  # share of the day's impressions whose item id is not in the table (ZCH only)
    seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)


def _optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.Adagrad(model.parameters(), lr=lr)


def train_day(model: IdClickModel, optimizer: torch.optim.Optimizer, split: data.ClickSplit, batch_size: int = 1024) -> float:
    """One pass over a day in order (online learning); returns the mean loss."""
    model.train()
    losses = []
    dense = split.dense
    for start in range(0, len(split) - batch_size + 1, batch_size):
        stop = start + batch_size
        logits = model(split.kjt(start, stop), dense[start:stop])
        loss = nn.functional.binary_cross_entropy_with_logits(logits, split.labels[start:stop].float())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return sum(losses) / max(len(losses), 1)


@torch.no_grad()
def score_day(model: IdClickModel, split: data.ClickSplit, batch_size: int = 4096) -> torch.Tensor:
    """Logits of every row of a day, in eval mode (a managed-collision table admits nothing)."""
    model.eval()
    dense = split.dense
    return torch.cat([
        model(split.kjt(s, min(s + batch_size, len(split))), dense[s : min(s + batch_size, len(split))])
        for s in range(0, len(split), batch_size)
    ])


def run_days(model: IdClickModel, log: data.DriftingLog, lr: float = 0.05, batch_size: int = 1024) -> list[DayResult]:
    """Train on day 0, score day 1, train on day 1, score day 2, ... (progressive validation).

    Each day is scored *before* the model has trained on it, as in production: yesterday's model serves
    today's traffic, so new ids arrive at a table that has never seen them.
    """
    import time

    optimizer = _optimizer(model, lr)
    results = []
    train_day(model, optimizer, log.days[0], batch_size)
    for day in range(1, len(log.days)):
        split = log.days[day]
        start = time.perf_counter()
        logits = score_day(model, split)
        new = log.first_seen(day, "item")
        items = split.ids["item"][0]
        rows = rows_of(model.sparse, "item", items)
        miss = miss_row(model.sparse, "item")
        results.append(DayResult(
            day=day,
            auc=data.auc(logits, split.labels),
            bayes_auc=data.bayes_optimal_auc(split),
            new_item_auc=data.auc(logits[new], split.labels[new]) if 0 < int(split.labels[new].sum()) < int(new.sum()) else None,
            item_collisions=shared_row_fraction(items[rows != miss], rows[rows != miss]) if miss is not None
            else shared_row_fraction(items, rows),
            item_misses=0.0 if miss is None else float((rows == miss).float().mean()),
        ))
        train_day(model, optimizer, split, batch_size)
        results[-1].seconds = time.perf_counter() - start
    return results


# ------------------------------------------------------------------------------------------- sharded


def _kjt(feature: str, ids: torch.Tensor) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=[feature], values=ids, lengths=torch.ones(len(ids), dtype=torch.long))


def sharded_residents(
    rows: int, policy: str, input_hash_size: int, batches: Sequence[Sequence[torch.Tensor]], feature: str = "item"
) -> dict[str, Any]:
    """Run on every rank: a managed-collision EBC of one ``rows``-row table, sharded row-wise by DMP.

    ``batches[step][rank]`` are the raw ids rank ``rank`` feeds at ``step``. Returns this rank's part of the
    table: its row range and ``{raw id: row}`` of the ids it holds after the last step.
    """
    import torch.distributed as dist
    from torchrec.distributed.mc_embeddingbag import ManagedCollisionEmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    module = zch_ebc(id_tables(rows, features=(feature,)), policy, input_hash_size=input_hash_size)
    sharder = ManagedCollisionEmbeddingBagCollectionSharder()
    plan = construct_module_sharding_plan(
        module, per_param_sharding={f"t_{feature}": row_wise(compute_kernel="fused")}, sharder=sharder,
        local_size=world, world_size=world, device_type="cpu",
    )
    model = DistributedModelParallel(
        module, env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
        plan=ShardingPlan({"": plan}), sharders=[sharder],
    )
    model.train()
    for step in batches:
        model(_kjt(feature, step[rank]))
    local = model.module if hasattr(model, "module") else model._dmp_wrapped_module
    mch = next(iter(local._managed_collision_collection._managed_collision_modules.values()))
    return {
        "module": type(local).__name__,
        "rows": (int(mch._output_global_offset), int(mch._output_global_offset + mch._zch_size)),
        "residents": _map_of(mch),
    }


def reference_residents(
    rows: int, policy: str, input_hash_size: int, batches: Sequence[Sequence[torch.Tensor]], world_size: int,
    feature: str = "item",
) -> list[dict[int, int]]:
    """What row-wise sharding should give, computed in this process with unsharded modules.

    One unsharded managed-collision table of ``rows / world_size`` rows per rank; at each step, shard r sees
    the ids in block r of ``[0, input_hash_size)``, rank 0's first, then rank 1's, ... (the order of the
    input all-to-all). Returns per shard ``{raw id: row}``, rows numbered globally as the sharded table does.
    """
    per_shard = rows // world_size
    block = -(-input_hash_size // world_size)
    shards = [zch_ebc(id_tables(per_shard, features=(feature,)), policy, input_hash_size=input_hash_size)
              for _ in range(world_size)]
    for step in batches:
        for r, shard in enumerate(shards):
            ids = torch.cat([torch.as_tensor(part)[torch.as_tensor(part) // block == r] for part in step])
            if len(ids):
                shard.train()
                shard(_kjt(feature, ids))
    return [{i: row + r * per_shard for i, row in resident_ids(shard, feature).items()} for r, shard in enumerate(shards)]
