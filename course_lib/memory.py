"""Bytes of parameters, gradients and optimizer state held by this rank: measured, and as ZeRO predicts.

    from course_lib import memory

    def fn():                                     # runs on every rank
        ...                                       # build, shard (or not), one optimizer step
        return memory.measure(model, optimizer).as_dict()

    memory.zero_bytes(num_params, world_size=4, stage=3)   # what the ZeRO paper's formula says

Measured means read off the tensors this rank really holds: a plain tensor counts in full, a DTensor (an
FSDP2 parameter, its gradient, the optimizer state built from it) counts its local shard only
(``to_local()``). A plain module, a DDP-wrapped module and an FSDP2-sharded module are measured the same
way. Measure between steps (after ``optimizer.step()``): during forward and backward FSDP swaps the full,
unsharded parameters in temporarily.

Two things the numbers leave out, as the ZeRO formula does: activations and temporary buffers (DDP's
gradient buckets, FSDP's all-gather buffers), and Adam's step counter (one 4-byte scalar per parameter
tensor; ``include_step=True`` counts it). FSDP2 pads a parameter whose first dimension does not divide by
the world size; ``to_local()`` shows the shard without that padding.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

import torch
from torch import nn

__all__ = [
    "RankMemory",
    "tensor_bytes",
    "param_bytes",
    "grad_bytes",
    "optimizer_state_bytes",
    "measure",
    "count_params",
    "zero_bytes",
    "ZERO_STAGES",
    "FP32_ADAM",
    "MIXED_PRECISION_ADAM",
    "format_bytes",
]

# What each ZeRO stage shards across the data-parallel ranks (Rajbhandari et al., 2020).
ZERO_STAGES: dict[int, str] = {
    0: "nothing (DDP: every rank holds everything)",
    1: "optimizer state",
    2: "optimizer state + gradients",
    3: "optimizer state + gradients + parameters (FSDP full sharding)",
}
# Bytes per parameter: fp32 training with Adam (two fp32 states), as in the labs ...
FP32_ADAM: dict[str, int] = {"param_bytes": 4, "grad_bytes": 4, "optimizer_bytes": 8}
# ... and the paper's mixed precision: fp16 params and grads, fp32 master copy + two Adam states (K = 12).
MIXED_PRECISION_ADAM: dict[str, int] = {"param_bytes": 2, "grad_bytes": 2, "optimizer_bytes": 12}


@dataclass(frozen=True)
class RankMemory:
    """Bytes of model state on one rank."""

    params: int
    grads: int
    optimizer: int

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer

    def as_dict(self) -> dict[str, int]:
        """Plain data (travels back from a launched rank), with the total."""
        return {**asdict(self), "total": self.total}


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes this rank holds for `t`: the local shards of a ShardedTensor (torchrec's sharded tables and their
    fused optimizer state), the local shard of a DTensor, the whole of any other tensor."""
    from torch.distributed.tensor import DTensor

    if hasattr(t, "local_shards") and hasattr(t, "metadata"):  # ShardedTensor; its numel() would warn
        return sum(shard.tensor.numel() * shard.tensor.element_size() for shard in t.local_shards())
    if isinstance(t, DTensor):
        t = t.to_local()
    return t.numel() * t.element_size()


def _unique(tensors: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if id(t) not in seen:  # tied weights count once
            seen.add(id(t))
            out.append(t)
    return out


def param_bytes(module: nn.Module) -> int:
    """Bytes of `module`'s parameters on this rank (a shared parameter counts once)."""
    return sum(tensor_bytes(p) for p in _unique(module.parameters()))


def grad_bytes(module: nn.Module) -> int:
    """Bytes of the gradients held in ``p.grad`` for `module`'s parameters on this rank (None counts 0)."""
    return sum(tensor_bytes(p.grad) for p in _unique(module.parameters()) if p.grad is not None)


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, include_step: bool = False) -> int:
    """Bytes of the tensors in ``optimizer.state`` on this rank (Adam: ``exp_avg`` and ``exp_avg_sq``).

    The state exists only after the first ``optimizer.step()``. Adam's ``step`` counters are left out
    unless `include_step`.
    """
    total = 0
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and (include_step or key != "step"):
                total += tensor_bytes(value)
    return total


def measure(module: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> RankMemory:
    """Parameters, gradients and optimizer state that this rank holds for `module` now."""
    return RankMemory(
        params=param_bytes(module),
        grads=grad_bytes(module),
        optimizer=0 if optimizer is None else optimizer_state_bytes(optimizer),
    )


def count_params(module: nn.Module) -> int:
    """Number of parameters of the whole model (a DTensor counts its global size; shared ones once).

    Works on ``meta`` modules too: nothing is allocated.
    """
    return sum(p.numel() for p in _unique(module.parameters()))


def zero_bytes(
    num_params: int,
    world_size: int,
    stage: int,
    *,
    param_bytes: int = 4,
    grad_bytes: int = 4,
    optimizer_bytes: int = 8,
) -> RankMemory:
    """Per-rank bytes of model state under ZeRO `stage` (0 = DDP, 3 = FSDP full sharding).

    Ψ = `num_params`; each parameter costs `param_bytes` + `grad_bytes` + `optimizer_bytes` (defaults:
    fp32 with Adam, 4 + 4 + 8; the paper's mixed precision is ``**MIXED_PRECISION_ADAM``, 2 + 2 + 12).
    Stage 1 divides the optimizer state by `world_size`, stage 2 the gradients too, stage 3 the parameters
    too. Shards round up, as the largest shard does.
    """
    if stage not in ZERO_STAGES:
        raise ValueError(f"stage must be one of {sorted(ZERO_STAGES)}; got {stage!r}")
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1; got {world_size}")

    def part(bytes_per_param: int, sharded: bool) -> int:
        full = num_params * bytes_per_param
        return math.ceil(full / world_size) if sharded else full

    return RankMemory(
        params=part(param_bytes, stage >= 3),
        grads=part(grad_bytes, stage >= 2),
        optimizer=part(optimizer_bytes, stage >= 1),
    )


def format_bytes(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``, ``3 * 2**30`` -> ``"3 GiB"``: binary units (1 KiB = 1024 bytes), three
    significant digits, the course's one convention for memory (torch's memory statistics and torchrec's planner
    count in powers of 1024 too; only link bandwidths are quoted in decimal GB/s)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < (1023.5 if unit != "B" else 1024) or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" or abs(n) >= 999.5 else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
