"""Embedding optimizers, fused and not: what each one keeps on a rank, and how long its training step takes.

    model = optimizers.row_wise_ebc(tables, sharder, kernel="fused")   # every table row-wise over all ranks
    report = optimizers.measure_training(model, model.fused_optimizer, batches)
    report.as_dict()          # {"params": ..., "grads": ..., "optimizer": ..., "total": ..., "ms": ...}
    optimizers.state_rows(model.fused_optimizer)  # one row per state tensor: its name, local shape, bytes

Works for every optimizer a lab meets: a ``torch.optim`` optimizer, a torchrec ``KeyedOptimizer`` (a DMP
model's ``fused_optimizer``, whose states are ``ShardedTensor``s), a ``CombinedOptimizer`` of both. Bytes
are what this rank holds: a ``ShardedTensor`` counts its local shards, a ``DTensor`` its local part. The
functions that touch a sharded model (``row_wise_ebc``, ``measure_training``) run on every rank at once,
under ``launch()`` or torchrun.

Never ask a ``ShardedTensor`` for ``.size()`` or use it as a dict key here: both go through its deprecated
``__torch_function__`` (a FutureWarning per call); its ``metadata()`` and ``local_shards()`` do not.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
from torch import nn

from course_lib import memory

__all__ = [
    "StepReport",
    "leaf_optimizers",
    "local_bytes",
    "local_shape",
    "measure_training",
    "row_wise_ebc",
    "state_bytes",
    "state_rows",
    "sum_of_squares",
]


def _is_sharded_tensor(t: Any) -> bool:
    return hasattr(t, "local_shards") and hasattr(t, "metadata")


# Bytes this rank holds for a tensor: a ShardedTensor's local shards, a DTensor's local part, any other whole.
local_bytes = memory.tensor_bytes


def local_shape(t: torch.Tensor) -> tuple[int, ...]:
    """The shape of what this rank holds for `t` (a ShardedTensor's local shards stacked along dim 0)."""
    if _is_sharded_tensor(t):
        shards = [shard.tensor for shard in t.local_shards()]
        if not shards:
            return (0,)
        return (sum(s.shape[0] for s in shards), *shards[0].shape[1:])
    if hasattr(t, "to_local"):
        t = t.to_local()
    return tuple(t.shape)


def leaf_optimizers(optimizer: Any) -> Iterator[Any]:
    """The leaf optimizers inside `optimizer` (a CombinedOptimizer holds ``(name, optimizer)`` pairs)."""
    inner = getattr(optimizer, "optimizers", None)
    if isinstance(inner, list):
        for item in inner:
            yield from leaf_optimizers(item[1] if isinstance(item, tuple) else item)
    else:
        yield optimizer


def state_rows(optimizer: Any, include_step: bool = False) -> list[dict[str, Any]]:
    """One row per state tensor this rank holds: ``{"parameter", "state", "local shape", "bytes"}``.

    "parameter" is the parameter's name where the optimizer knows it (torchrec's keyed optimizers), else its
    position. A fused table's states are named by fbgemm (``"t_big.momentum1"``: Adagrad's sum of squared
    gradients). Adam's ``step`` counters are left out unless `include_step`.
    """
    rows = []
    for leaf in leaf_optimizers(optimizer):
        names = {id(p): name for name, p in getattr(leaf, "params", {}).items()}  # by id: no ShardedTensor hashing
        for position, (param, state) in enumerate(leaf.state.items()):
            for key, value in state.items():
                if not isinstance(value, torch.Tensor) and not _is_sharded_tensor(value):
                    continue
                if key == "step" and not include_step:
                    continue
                rows.append(
                    {
                        "parameter": names.get(id(param), f"#{position}"),
                        "state": key,
                        "local shape": local_shape(value),
                        "bytes": local_bytes(value),
                    }
                )
    return rows


def state_bytes(optimizer: Any, include_step: bool = False) -> int:
    """Bytes of optimizer state on this rank, summed over :func:`state_rows`."""
    return sum(row["bytes"] for row in state_rows(optimizer, include_step))


def sum_of_squares(output: Any) -> torch.Tensor:
    """A stand-in loss for an EBC alone: the sum of squares of its pooled output (waits on an awaitable)."""
    if hasattr(output, "wait") and not hasattr(output, "values"):
        output = output.wait()
    return output.values().pow(2).sum()


@dataclass(frozen=True)
class StepReport:
    """What one rank held after its last training step, and the median time of a step (forward, backward,
    optimizer step) in milliseconds."""

    params: int
    grads: int
    optimizer: int
    ms: float

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, float]:
        """Plain data (travels back from a launched rank), with the total."""
        return {**asdict(self), "total": self.total}


def measure_training(
    model: nn.Module,
    optimizer: Any,
    batches: Iterable[Any],
    loss: Callable[[Any], torch.Tensor] = sum_of_squares,
    warmup: int = 1,
) -> StepReport:
    """Train `model` one step per batch (``loss(model(batch))``, backward, ``optimizer.step()``) and report.

    Bytes are read after the last step, before gradients are zeroed: the gradients a step really held.
    The time is the median over the steps after the first `warmup` ones. A fused table updates inside
    backward, so its step time includes its update, and its ``optimizer.step()`` has nothing left to do.
    """
    seconds = []
    grads = 0
    batches = list(batches)
    if len(batches) <= warmup:
        raise ValueError(f"need more than warmup={warmup} batches, got {len(batches)}")
    for i, batch in enumerate(batches):
        optimizer.zero_grad()
        start = time.perf_counter()
        loss(model(batch)).backward()
        optimizer.step()
        if i >= warmup:
            seconds.append(time.perf_counter() - start)
        grads = memory.grad_bytes(model)
    return StepReport(
        params=memory.param_bytes(model),
        grads=grads,
        optimizer=state_bytes(optimizer),
        ms=statistics.median(seconds) * 1e3,
    )


def row_wise_ebc(
    tables: Sequence[Any], sharder: Any | None = None, kernel: str = "fused", device: torch.device | str | None = None
) -> nn.Module:
    """DistributedModelParallel over an EBC of `tables`, every table row-wise over all ranks (run on every rank).

    `kernel` is the compute kernel: ``"fused"`` (the sharder's fused optimizer updates the table inside
    backward; without fused params fbgemm's default is exact SGD at lr 0.01) or ``"dense"`` (the table gets
    a gradient like any parameter, for a torch optimizer). Each rank holds ``ceil(rows / world_size)``
    rows of every table (the last rank fewer when it does not divide).
    """
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import row_wise

    from course_lib import planning
    from course_lib.launcher._rank import rank_device

    sharder = sharder or EmbeddingBagCollectionSharder()
    plan = planning.hand_plan(
        tables,
        {table.name: row_wise(compute_kernel=kernel) for table in tables},
        world_size=dist.get_world_size(),
        sharder=sharder,
        device_type=torch.device(device or rank_device()).type,
    )
    return DistributedModelParallel(
        planning.meta_ebc(tables), device=torch.device(device or rank_device()), plan=plan, sharders=[sharder]
    )
