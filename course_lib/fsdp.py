"""FSDP2 applied from outside the model, torchtitan style: ``fully_shard`` on each block, then on the root.

    from course_lib.fsdp import parallelize

    model = TinyTransformer()                     # a plain nn.Module; it does not know about ranks
    parallelize(model)                            # blocks = model.layers; now every parameter is a DTensor
    optimizer = torch.optim.Adam(model.parameters())   # after sharding: it must see the DTensors

Each ``fully_shard`` call makes one *group*: its parameters are all-gathered in one collective before the
group's forward (and again before its backward, when it resharded after forward), and their gradients are
reduce-scattered in one collective. Sharding block by block keeps only one block's full parameters alive
at a time; the root call picks up what the blocks left (embeddings, final norm, head). FSDP2 has no
auto-wrap policy: which modules form groups is this explicit list.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy

__all__ = ["parallelize", "fsdp_groups", "full_parameters", "is_sharded", "held_bytes"]


def parallelize(
    model: nn.Module,
    blocks: Iterable[nn.Module | Sequence[nn.Module]] | None = None,
    *,
    mesh: DeviceMesh | None = None,
    reshard_after_forward: bool | int | None = None,
    mp_policy: MixedPrecisionPolicy | None = None,
) -> nn.Module:
    """Shard `model` with FSDP2 in place: ``fully_shard`` on each of `blocks`, then on `model`; returns it.

    Args:
        model: the root module (run on every rank, after the process group exists).
        blocks: the modules to shard one by one, bottom-up; default ``model.layers``. An entry that is a
            list of modules becomes one group (``fully_shard([a, b])``): the way to keep modules that share
            a parameter (tied embedding and output head) in the same group.
        mesh: the device mesh to shard over; default all ranks, on the device type of the process group.
        reshard_after_forward: ``True`` frees each group's full parameters after forward and all-gathers
            them again in backward (ZeRO-3); ``False`` keeps them until backward ends (ZeRO-2); ``None``
            lets FSDP choose (``True`` for blocks, ``False`` for the root, whose backward comes first).
        mp_policy: a ``MixedPrecisionPolicy`` for every group (default: compute in the parameters' dtype).

    Build the optimizer after this call: ``fully_shard`` replaces the parameters with new DTensor ones.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: F811  (the runtime import)

    if blocks is None:
        if not isinstance(getattr(model, "layers", None), nn.ModuleList):
            raise ValueError(
                f"{type(model).__name__} has no `layers` ModuleList: pass blocks=[...] (the modules to shard "
                "one by one, e.g. the transformer blocks)"
            )
        blocks = model.layers
    options: dict = {"reshard_after_forward": reshard_after_forward, "mp_policy": mp_policy or MixedPrecisionPolicy()}
    if mesh is not None:
        options["mesh"] = mesh
    for block in blocks:
        fully_shard(block if isinstance(block, nn.Module) else list(block), **options)
    fully_shard(model, **options)
    return model


def fsdp_groups(model: nn.Module) -> list[str]:
    """Names of the submodules that ``fully_shard`` was called on (``""`` is the root), in module order."""
    from torch.distributed.fsdp import FSDPModule

    return [name for name, module in model.named_modules() if isinstance(module, FSDPModule)]


def is_sharded(param: torch.Tensor) -> bool:
    """True for an FSDP2 parameter (a DTensor); False for a plain tensor."""
    from torch.distributed.tensor import DTensor

    return isinstance(param, DTensor)


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of `model` in full, as plain detached CPU tensors, by name.

    DTensors are gathered with ``full_tensor()``, a collective: call this on every rank at the same time.
    """
    out = {}
    for name, param in model.named_parameters():
        full = param.full_tensor() if is_sharded(param) else param
        out[name] = full.detach().cpu().clone()
    return out


def held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> dict[str, int]:
    """Bytes this rank holds now for an FSDP2 `model`, at any moment, forward and backward included.

    ``"sharded params"``: FSDP's shards (kept in the parameters' own dtype, fp32 here, even while the full
    parameters exist); ``"full params"``: the unsharded parameters FSDP all-gathered and has not freed yet (in
    ``param_dtype`` under a ``MixedPrecisionPolicy``); ``"grads"``: gradients, sharded or full;
    ``"optimizer"``: the tensors in ``optimizer.state`` but Adam's step counters. Each storage counts once,
    a freed one (resized to 0) not at all. ``memory.measure`` sees only the parameters registered on the
    modules, which between forward and backward may be the full ones alone.
    """
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    seen: dict[int, tuple[str, int]] = {}

    def add(kind: str, t: torch.Tensor | None) -> None:
        if t is None:
            return
        storage = (t.to_local() if isinstance(t, DTensor) else t).untyped_storage()
        if storage.nbytes():
            seen.setdefault(storage.data_ptr(), (kind, storage.nbytes()))

    params = []  # FSDP's own record of each parameter: its shard, its all-gathered copy (FSDPParam)
    for module in model.modules():
        group = module._get_fsdp_state()._fsdp_param_group if isinstance(module, FSDPModule) else None
        params += group.fsdp_params if group is not None else []
    for param in params:
        add("sharded params", param._sharded_param_data)
    for param in params:
        for t in [*param.all_gather_outputs, getattr(param, "_unsharded_param", None)]:
            add("full params", t)
    for param in params:
        add("grads", param.sharded_param.grad)
        unsharded = getattr(param, "_unsharded_param", None)
        add("grads", unsharded.grad if unsharded is not None else None)
    for state in (optimizer.state.values() if optimizer is not None else []):
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                add("optimizer", value)
    held = dict.fromkeys(("sharded params", "full params", "grads", "optimizer"), 0)
    for kind, nbytes in seen.values():
        held[kind] += nbytes
    return held
