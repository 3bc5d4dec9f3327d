"""Checkpoint a sharded model with ``torch.distributed.checkpoint`` (DCP): what to save, how to resume, what is in it.

    app = checkpoint.AppState(model, optimizer, step)        # a Stateful: model + optimizer + step
    dcp.save({"app": app}, checkpoint_id=root / checkpoint.step_folder(step))   # every rank, its own shards
    ...
    model, optimizer = ...                                   # built and sharded again, maybe another way
    checkpoint.init_optimizer_state(optimizer)               # lazy optimizer state must exist before a load
    app = checkpoint.AppState(model, optimizer)
    dcp.load({"app": app}, checkpoint_id=checkpoint.latest(root))   # each rank reads the slices it now holds
    checkpoint.batch_at(split, app.step, batch_size)          # the data order is a function of the step

and to look at a checkpoint: ``checkpoint.contents(path)`` (one row per saved entry), ``checkpoint.sizes(path)``
(bytes per file), ``checkpoint.full_tensors(state_dict)`` (every entry of a sharded state dict as one whole
tensor, on every rank: to compare two shardings of the same weights).

Everything here works for a DistributedModelParallel model (ShardedTensor tables, torchrec's
KeyedOptimizers, the fused optimizer's state inside them) and for FSDP2 parameters (DTensors). Functions that
take a process group's view (``full_tensors``) are collectives: call them on every rank.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

if TYPE_CHECKING:
    import pandas

    from course_lib.data import ClickSplit

__all__ = [
    "AppState",
    "batch_at",
    "contents",
    "full_tensors",
    "init_optimizer_state",
    "latest",
    "sizes",
    "step_folder",
]


class AppState(Stateful):
    """What a training job must save to resume exactly: the model, its optimizer, and the step.

    ``dcp.save({"app": app}, ...)`` calls ``state_dict()`` on every rank; ``dcp.load({"app": app}, ...)`` calls
    ``state_dict()`` for the tensors to load into (their shapes and shards say what this rank reads), loads
    them in place, then calls ``load_state_dict()`` with the result.

    For a DMP model, ``model.state_dict()`` holds ShardedTensors for the sharded tables and plain tensors for
    the replicated parts; a torchrec optimizer's ``state_dict()`` is keyed by parameter name (not by position,
    as torch's are), and a CombinedOptimizer's includes the fused optimizer's state (``model.fused_optimizer``),
    which lives nowhere else.
    """

    def __init__(self, model: torch.nn.Module, optimizer: Any, step: int = 0) -> None:
        self.model = model
        self.optimizer = optimizer
        self.step = step

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(), "step": self.step}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        self.model.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        self.step = int(state_dict["step"])


def _torch_optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    """The plain torch optimizers inside `optimizer` (a torch optimizer, or torchrec Keyed/Combined ones)."""
    from torchrec.optim.keyed import KeyedOptimizer, KeyedOptimizerWrapper, OptimizerWrapper

    from course_lib.optimizers import leaf_optimizers

    found = []
    for leaf in leaf_optimizers(optimizer):
        if isinstance(leaf, (KeyedOptimizerWrapper, OptimizerWrapper)):
            found += _torch_optimizers(leaf._optimizer)
        elif not isinstance(leaf, KeyedOptimizer):  # e.g. the fused optimizer: its state exists from the start
            found.append(leaf)
    return found


@torch.no_grad()
def init_optimizer_state(optimizer: Any) -> None:
    """Create the state of every lazily initialised optimizer inside `optimizer`, without changing a weight.

    Adam (like most torch optimizers) creates its state in its first ``step()``. A checkpoint is loaded
    *into* the tensors of ``optimizer.state_dict()``: for a fresh Adam there are none, so a load would
    restore nothing of it and say nothing. This runs one step with zero gradients and a learning rate of 0
    on each torch optimizer that has no state yet (what ``torch.distributed.checkpoint.state_dict`` does
    for torch optimizers), so the state exists and the load overwrites it. That step is counted: a state the
    load does not replace keeps ``step`` 1 (zero moments), so its first real update is 26 % smaller than a new
    Adam's; set its ``step`` back to 0 where the optimizer should start afresh. The fused embedding optimizer
    allocates its state with the tables and is left alone.
    """
    for inner in _torch_optimizers(optimizer):
        if inner.state:
            continue
        params = [p for group in inner.param_groups for p in group["params"] if p.requires_grad]
        for p in params:
            p.grad = torch.zeros_like(p)
        rates = [group["lr"] for group in inner.param_groups]
        for group in inner.param_groups:
            group["lr"] = 0.0
        inner.step()
        for group, rate in zip(inner.param_groups, rates):
            group["lr"] = rate
        inner.zero_grad(set_to_none=True)


def step_folder(step: int) -> str:
    """The folder name of the checkpoint taken after `step` steps: "step_000040" (names sort by step)."""
    return f"step_{step:06d}"


def latest(root: str | os.PathLike[str]) -> Path | None:
    """The newest complete checkpoint under `root` (a ``step_folder`` with DCP's ``.metadata``), or None.

    ``dcp.save`` writes ``.metadata`` last, after every rank has written its data: a save cut short by a
    failure leaves a folder without it, which this skips.
    """
    root = Path(root)
    done = [p for p in root.glob("step_*") if (p / ".metadata").is_file()] if root.is_dir() else []
    return max(done, key=lambda p: p.name, default=None)


def batch_at(split: ClickSplit, step: int, batch_size: int, rank: int | None = None, world_size: int | None = None) -> Any:
    """This rank's batch of global step `step`: a function of the step alone, so a resumed run sees the
    same data as an uninterrupted one.

    Step s takes the s-th block of ``batch_size * world_size`` rows (wrapping around at the end of the
    split, one epoch later) and rank r its r-th `batch_size` rows: the same rows as ``data.batches`` gives.
    """
    if rank is None or world_size is None:
        rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    step_rows = batch_size * world_size
    steps_per_epoch = len(split) // step_rows
    if steps_per_epoch == 0:
        raise ValueError(f"the split has {len(split)} rows, fewer than one step's {step_rows}")
    start = (step % steps_per_epoch) * step_rows + rank * batch_size
    return split.batch(start, start + batch_size)


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, Mapping):
        for key, inner in value.items():
            _flatten(inner, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = value


def _describe(value: Any) -> tuple[str, tuple[int, ...], str] | None:
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torch.distributed.tensor import DTensor

    if isinstance(value, ShardedTensor):
        return "sharded", tuple(value.metadata().size), str(value.metadata().tensor_properties.dtype)
    if isinstance(value, DTensor):
        return "dtensor", tuple(value.shape), str(value.dtype)
    if isinstance(value, torch.Tensor):
        return "tensor", tuple(value.shape), str(value.dtype)
    return None


def full_tensors(state_dict: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """Every tensor of a (nested) sharded state dict as one whole CPU tensor, the same on every rank.

    A collective: call it on every rank. Keys are flattened with dots ("optimizer.state.<param>.exp_avg").
    A ShardedTensor is assembled from all ranks' shards (a key some ranks lack, such as the fused optimizer
    state of a table that lives whole on another rank, is taken from the ranks that have it); a DTensor
    with ``full_tensor()``; a plain tensor is taken as this rank's value. Non-tensors are left out. Meant
    for the small models of the labs: it materialises everything on every rank.
    """
    flat: dict[str, Any] = {}
    _flatten(state_dict, "", flat)
    mine = {key: d for key, d in ((k, _describe(v)) for k, v in flat.items()) if d is not None}
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world > 1:
        everyone: list[dict[str, Any]] = [{} for _ in range(world)]
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    union: dict[str, tuple[str, tuple[int, ...], str]] = {}
    for described in everyone:
        union.update(described)
    out: dict[str, torch.Tensor] = {}
    for key in sorted(union):
        kind, shape, dtype = union[key]
        value = flat.get(key)
        if kind == "dtensor":
            out[key] = value.full_tensor().detach().cpu().clone()
        elif kind == "sharded":
            whole = torch.zeros(shape, dtype=getattr(torch, dtype.removeprefix("torch.")))
            if value is not None:
                for shard in value.local_shards():
                    index = tuple(slice(o, o + n) for o, n in zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes))
                    whole[index] = shard.tensor.detach().cpu()
            if world > 1:  # every element lives in exactly one shard: a sum assembles the whole, exactly
                dist.all_reduce(whole)
            out[key] = whole
        elif value is not None:
            out[key] = value.detach().cpu().clone()
    return out


def contents(path: str | os.PathLike[str]) -> "pandas.DataFrame":
    """One row per entry of a DCP checkpoint, read from its ``.metadata`` alone (no process group needed):
    the key, what it is (tensor or a pickled object), its global shape, how many chunks were written, bytes."""
    import pandas as pd
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(os.fspath(path)).read_metadata()
    rows = []
    for key, entry in metadata.state_dict_metadata.items():
        if isinstance(entry, TensorStorageMetadata):
            element = torch.empty((), dtype=entry.properties.dtype).element_size()
            rows.append({"key": key, "kind": "tensor", "global shape": tuple(entry.size), "chunks": len(entry.chunks),
                         "bytes": sum(int(torch.Size(c.sizes).numel()) for c in entry.chunks) * element})
        else:
            rows.append({"key": key, "kind": "object", "global shape": None, "chunks": 1, "bytes": None})
    frame = pd.DataFrame(rows, columns=["key", "kind", "global shape", "chunks", "bytes"]).set_index("key").sort_index()
    frame["bytes"] = frame["bytes"].astype("Int64")  # None (a pickled object's size is not recorded) stays <NA>
    return frame


def sizes(path: str | os.PathLike[str]) -> dict[str, int]:
    """Bytes of each file of a checkpoint folder, by file name (``__0_0.distcp``: written by rank 0)."""
    return {p.name: p.stat().st_size for p in sorted(Path(path).iterdir()) if p.is_file()}
