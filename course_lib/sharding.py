"""Shard an EmbeddingBagCollection with a plan, load known weights into it, and compare it with the unsharded one.

Every function that takes a process group's view (``shard``, ``full_weights``, ``compare_with_unsharded``)
runs on every rank (under ``launch()`` or torchrun), CPU + gloo or GPU + NCCL alike:

    model = sharding.shard(tables, plan, weights_from=reference_ebc)   # DistributedModelParallel
    out = model(sharding.rank_slice(global_batch, rank, world_size)).wait()
    sharding.full_weights(model)                                         # every table, whole, on every rank

Conventions, as in a real data-parallel job: every rank feeds its own slice of the global batch, and
gradients are averaged over ranks. So the unsharded model that a sharded one must match is the unsharded
EBC trained on the *global* batch with the *mean* of the ranks' losses (TorchRec divides embedding
gradients by the world size in its collectives' backward, ``torchrec.distributed.comm_ops``
``GRADIENT_DIVISION``, the same convention as DDP for data-parallel tables).
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor, KeyedTensor
from torchrec.distributed import DistributedModelParallel
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.types import ShardingPlan
from torchrec.optim.keyed import KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from course_lib import planning
from course_lib.launcher._rank import rank_device

__all__ = [
    "compare_with_unsharded",
    "dense_optimizer",
    "full_weights",
    "max_abs_diff",
    "pooled",
    "random_batch",
    "rank_device",
    "rank_slice",
    "reference_ebc",
    "shard",
]


def reference_ebc(tables: Sequence[EmbeddingBagConfig], seed: int = 0) -> EmbeddingBagCollection:
    """The unsharded EBC of `tables` on CPU, its weights drawn from `seed` (the same on every rank)."""
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return EmbeddingBagCollection(tables=list(tables), device=torch.device("cpu"))
    finally:
        torch.random.set_rng_state(generator_state)


def shard(
    tables: Sequence[EmbeddingBagConfig],
    plan: ShardingPlan,
    *,
    weights_from: EmbeddingBagCollection | None = None,
    learning_rate: float = 0.01,
    device: torch.device | str | None = None,
) -> DistributedModelParallel:
    """DistributedModelParallel over an EBC of `tables`, sharded by `plan`, on this rank's device.

    The EBC is built on the meta device (no memory) and DMP materialises only this rank's shards. With
    `weights_from`, its weights are loaded (``load_state_dict`` of the full tables: each rank copies the
    rows and columns its shards cover). Tables with a fused kernel update in backward with SGD at
    `learning_rate` (the sharder's fused params); data-parallel tables need :func:`dense_optimizer`.
    """
    if device is None:
        device = rank_device()
    sharder = EmbeddingBagCollectionSharder(fused_params={"learning_rate": learning_rate})
    model = DistributedModelParallel(
        module=planning.meta_ebc(tables), device=torch.device(device), plan=plan, sharders=[sharder]
    )
    if weights_from is not None:
        model.load_state_dict(weights_from.state_dict())
    return model


def dense_optimizer(model: torch.nn.Module, learning_rate: float) -> KeyedOptimizerWrapper | None:
    """SGD over the parameters that no fused optimizer updates (data-parallel tables); None if there are none."""
    params = dict(in_backward_optimizer_filter(model.named_parameters()))
    if not params:
        return None
    return KeyedOptimizerWrapper(params, lambda p: torch.optim.SGD(p, lr=learning_rate))


def pooled(output: Any) -> dict[str, torch.Tensor]:
    """Per-feature pooled embeddings ``{feature: [B, dim]}`` of an EBC's output (waits on an awaitable)."""
    if hasattr(output, "wait") and not isinstance(output, KeyedTensor):
        output = output.wait()
    return output.to_dict()


def max_abs_diff(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    """Largest |a[k] - b[k]| over the keys of both (which must be the same)."""
    if set(a) != set(b):
        raise ValueError(f"different keys: {sorted(a)} vs {sorted(b)}")
    return max(((a[k].detach().cpu().float() - b[k].detach().cpu().float()).abs().max().item() for k in a), default=0.0)


def full_weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every table's whole weight on every rank, from the shards each rank holds (a collective: call on all ranks).

    Keys are the unsharded EBC's state_dict keys (``embedding_bags.<table>.weight``). Sharded tables are
    reassembled by summing, over ranks, a zero tensor with each rank's shards written in place (shards do
    not overlap); data-parallel tables are already whole.
    """
    device = rank_device()  # NCCL reduces tensors on the rank's GPU only
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if hasattr(value, "local_shards"):
            meta = value.metadata()  # not value.size()/.dtype: those go through ShardedTensor's deprecated torch_function
            whole = torch.zeros(meta.size, dtype=meta.tensor_properties.dtype, device=device)
            for shard in value.local_shards():
                (r0, c0), (rows, cols) = shard.metadata.shard_offsets, shard.metadata.shard_sizes
                whole[r0 : r0 + rows, c0 : c0 + cols] = shard.tensor.detach()
            dist.all_reduce(whole)
            out[key] = whole.cpu()
        else:
            out[key] = value.detach().cpu().clone()
    return out


def random_batch(
    tables: Sequence[EmbeddingBagConfig], batch_size: int, *, seed: int, max_ids_per_bag: int = 3
) -> KeyedJaggedTensor:
    """A batch of `batch_size` samples with 0..`max_ids_per_bag` ids per feature, drawn from `seed`."""
    generator = torch.Generator().manual_seed(seed)
    keys, lengths, values = [], [], []
    for table in tables:
        for feature in table.feature_names:
            bag_lengths = torch.randint(0, max_ids_per_bag + 1, (batch_size,), generator=generator)
            keys.append(feature)
            lengths.append(bag_lengths)
            values.append(torch.randint(0, table.num_embeddings, (int(bag_lengths.sum()),), generator=generator))
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))


def rank_slice(batch: KeyedJaggedTensor, rank: int, world_size: int) -> KeyedJaggedTensor:
    """Rank `rank`'s share of a global batch: samples ``[rank * B/W, (rank + 1) * B/W)`` of every feature."""
    size = batch.stride()
    if size % world_size:
        raise ValueError(f"a batch of {size} samples does not split evenly over {world_size} ranks")
    local = size // world_size
    lo, hi = rank * local, (rank + 1) * local
    keys, lengths, values = [], [], []
    for key, jagged in batch.to_dict().items():
        offsets = jagged.offsets()
        keys.append(key)
        lengths.append(jagged.lengths()[lo:hi])
        values.append(jagged.values()[offsets[lo] : offsets[hi]])
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=torch.cat(values), lengths=torch.cat(lengths))


def _loss(per_feature: Mapping[str, torch.Tensor]) -> torch.Tensor:
    return sum(v.pow(2).sum() for v in per_feature.values())  # type: ignore[return-value]


def compare_with_unsharded(
    tables: Sequence[EmbeddingBagConfig],
    plan: ShardingPlan,
    *,
    steps: int = 3,
    batch_size: int = 8,
    learning_rate: float = 0.1,
    seed: int = 0,
    loss: Callable[[Mapping[str, torch.Tensor]], torch.Tensor] = _loss,
    average_rank_losses: bool = True,
) -> dict[str, float]:
    """Train the sharded EBC and the unsharded one side by side; return the largest differences seen.

    Runs on every rank. Both start from the same weights (`seed`); at each step every rank takes its
    slice of one global batch; the sharded model trains on its slice, the unsharded reference (a full
    copy on each rank) on the whole batch with the mean of the per-rank losses, both with SGD at
    `learning_rate`. Returns ``{"forward": max |pooled difference|, "weights": max |weight difference|}``
    over all steps (weights compared after each step). ``average_rank_losses=False`` trains the reference
    on the sum of the ranks' losses instead: a control that should *not* match.
    """
    rank, world_size = dist.get_rank(), dist.get_world_size()
    reference = reference_ebc(tables, seed)
    model = shard(tables, plan, weights_from=reference, learning_rate=learning_rate)
    dense = dense_optimizer(model, learning_rate)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=learning_rate)
    local = batch_size // world_size
    worst = {"forward": 0.0, "weights": 0.0}
    for step in range(steps):
        batch = random_batch(tables, batch_size, seed=seed + 1000 + step)
        mine = pooled(model(rank_slice(batch, rank, world_size).to(rank_device())))
        everyone = pooled(reference(batch))
        mine_expected = {k: v[rank * local : (rank + 1) * local] for k, v in everyone.items()}
        worst["forward"] = max(worst["forward"], max_abs_diff(mine, mine_expected))

        loss(mine).backward()
        if dense is not None:
            dense.step()
            dense.zero_grad()
        reference_optimizer.zero_grad()
        ranks_losses = [loss({k: v[r * local : (r + 1) * local] for k, v in everyone.items()}) for r in range(world_size)]
        reference_loss = sum(ranks_losses)
        (reference_loss / world_size if average_rank_losses else reference_loss).backward()
        reference_optimizer.step()
        worst["weights"] = max(worst["weights"], max_abs_diff(full_weights(model), reference.state_dict()))
    return worst
