"""One recommender, two kinds of sharding: TorchRec shards the embeddings, FSDP2 shards the dense tower.

    from course_lib import hybrid

    model = click_dlrm(log.tables(16), log.config.num_dense, device="meta")   # a plain nn.Module
    dmp = hybrid.shard_hybrid(model)              # tables sharded by the plan, dense arch + over arch by FSDP2
    optimizer = hybrid.hybrid_optimizer(dmp)      # fused embedding optimizer + Adam over the DTensors
    losses = training.train(dmp, optimizer, log.train, batch_size=1024)

``DistributedModelParallel`` shards the modules its plan names (the EmbeddingBagCollection) and hands
the rest of the model to a *data-parallel wrapper*: by default ``DefaultDataParallelWrapper``, which wraps
the whole model in one DDP that ignores the sharded tables (every rank keeps a full replica of the dense
part and all-reduces its gradients). ``FullyShardDense`` is a wrapper that calls FSDP2's ``fully_shard``
on the dense modules instead: each rank keeps a shard of each dense parameter (a DTensor), all-gathers
them before use and reduce-scatters their gradients. Nothing else changes: the embeddings stay sharded
and fused by DMP, data-parallel tables keep the DDP the sharded EBC gives them.

Everything here runs on every rank (under ``launch`` or ``torchrun``), on gloo (CPU) or NCCL (GPU).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torchrec.distributed.model_parallel import DataParallelWrapper, DistributedModelParallel
from torchrec.distributed.types import ShardedModule, ShardingEnv

from course_lib import fsdp, memory, training

__all__ = ["FullyShardDense", "dense_modules", "hybrid_optimizer", "memory_by_part", "shard_hybrid"]


def _holds_sharded(module: nn.Module) -> bool:
    return any(isinstance(m, ShardedModule) for m in module.modules())


def dense_modules(model: nn.Module) -> list[str]:
    """Paths of the dense modules of a DMP-sharded `model`: the largest submodules that hold parameters and
    no sharded module (for ``click_dlrm``: ``model.dense_arch`` and ``model.over_arch``).

    `model` is what DMP wraps (``dmp._dmp_wrapped_module``), or a DMP itself (its wrapped module is used).
    A parameter held directly by a module that also holds a sharded module belongs to no dense module:
    ``FullyShardDense`` refuses such models (say which modules are dense with ``FullyShardDense(dense=...)``).
    """
    if isinstance(model, DistributedModelParallel):
        model = model._dmp_wrapped_module
    found: list[str] = []

    def visit(module: nn.Module, path: str) -> None:
        for name, child in module.named_children():
            child_path = f"{path}.{name}" if path else name
            if isinstance(child, ShardedModule) or not any(True for _ in child.parameters()):
                continue
            if _holds_sharded(child):
                visit(child, child_path)
            else:
                found.append(child_path)

    visit(model, "")
    return found


def _outermost(module: nn.Module, types: tuple[type[nn.Module], ...]) -> list[nn.Module]:
    """The submodules of `module` (not itself) of one of `types`, skipping those inside another one."""
    blocks: list[nn.Module] = []

    def visit(parent: nn.Module) -> None:
        for child in parent.children():
            if isinstance(child, types) and any(True for _ in child.parameters()):
                blocks.append(child)
            else:
                visit(child)

    visit(module)
    return blocks


def _default_block_types() -> tuple[type[nn.Module], ...]:
    from torchrec.modules.mlp import Perceptron

    return (Perceptron,)


class FullyShardDense(DataParallelWrapper):
    """A DMP data-parallel wrapper that shards the dense part of the model with FSDP2 instead of DDP.

    ``wrap(dmp, env, device)`` (DMP calls it once, after sharding the embeddings and materialising the
    parameters) runs ``course_lib.fsdp.parallelize`` on each dense module: ``fully_shard`` on each of its
    blocks, then on the module itself. Every dense parameter becomes a DTensor sharded ``Shard(0)`` over
    the ranks of DMP's process group; the sharded embeddings are not touched.

    Args:
        dense: paths (inside the model DMP wraps) of the modules to shard, e.g.
            ``["model.dense_arch", "model.over_arch"]``; default ``dense_modules(model)``.
        block_types: inside each dense module, the outermost submodules of these types become groups of
            their own before the module's group (default: torchrec's ``Perceptron``, one per MLP layer).
            ``()`` makes each dense module one group.
        reshard_after_forward, mp_policy: passed on to ``fully_shard`` (see ``course_lib.fsdp.parallelize``).
        sync_module_states: first broadcast rank 0's dense parameters and buffers to every rank, as DDP does
            when it wraps a model. DMP initialises each rank's embedding shards from the same RNG, so the
            ranks' RNGs part ways and their dense initial weights differ; ``fully_shard`` keeps each rank's
            own rows, which would make the starting model a patchwork of the ranks' initialisations.
    """

    def __init__(
        self,
        dense: Sequence[str] | None = None,
        *,
        block_types: tuple[type[nn.Module], ...] | None = None,
        reshard_after_forward: bool | int | None = None,
        mp_policy: Any = None,
        sync_module_states: bool = True,
    ) -> None:
        self.dense = list(dense) if dense is not None else None
        self.block_types = _default_block_types() if block_types is None else tuple(block_types)
        self.reshard_after_forward = reshard_after_forward
        self.mp_policy = mp_policy
        self.sync_module_states = sync_module_states

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        from torch.distributed.device_mesh import DeviceMesh

        model = dmp._dmp_wrapped_module
        paths = self.dense if self.dense is not None else dense_modules(model)
        if not paths:
            raise ValueError(f"{type(model).__name__} has no dense module to shard: every parameter is sharded")
        for path in paths:
            if _holds_sharded(model.get_submodule(path)):
                raise ValueError(f"{path!r} holds a sharded embedding module: FSDP must shard only dense modules")
        if env.process_group is None:
            raise RuntimeError("FullyShardDense needs a process-group based ShardingEnv")
        mesh = DeviceMesh.from_group(env.process_group, device_type=device.type)
        for path in paths:
            module = model.get_submodule(path).to(device)
            if self.sync_module_states:
                _broadcast_from_rank0(module, env.process_group)
            fsdp.parallelize(
                module,
                _outermost(module, self.block_types),
                mesh=mesh,
                reshard_after_forward=self.reshard_after_forward,
                mp_policy=self.mp_policy,
            )


def _broadcast_from_rank0(module: nn.Module, group: Any) -> None:
    from torch import distributed as dist

    source = dist.get_global_rank(group, 0)
    with torch.no_grad():
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=source, group=group)


def shard_hybrid(
    model: nn.Module,
    *,
    sharders: list[Any] | None = None,
    plan: Any = None,
    device: torch.device | None = None,
    wrapper: DataParallelWrapper | None = None,
) -> DistributedModelParallel:
    """`model` sharded two ways: its embedding tables by TorchRec (DMP, with `plan`, or the planner's plan
    for the real ranks when None), its dense modules by FSDP2 (`wrapper`, default ``FullyShardDense()``).

    Build `model` on ``meta`` (nothing is allocated until DMP places each rank's part) after seeding the
    RNG the same on every rank. Sharders default to ``training.sharders()`` (fused Adagrad in backward),
    the device to ``training.device()``. Run on every rank.
    """
    from torch import distributed as dist
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from course_lib import planning

    sharders = training.sharders() if sharders is None else sharders
    device = training.device() if device is None else device
    if plan is None:  # plan on rank 0 for the ranks that exist, broadcast to all
        planner = EmbeddingShardingPlanner(topology=planning.topology(dist.get_world_size(), compute_device=device.type))
        plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    return DistributedModelParallel(
        model, device=device, plan=plan, sharders=sharders, data_parallel_wrapper=wrapper or FullyShardDense()
    )


def hybrid_optimizer(model: nn.Module, dense_learning_rate: float = training.DEFAULT_DENSE_LR) -> Any:
    """One optimizer for a hybrid model: DMP's fused embedding optimizer plus Adam over every parameter that
    no fused kernel updates inside backward (the dense DTensors, and data-parallel tables).

    The two are joined in a ``CombinedOptimizer``: one ``step()``, ``zero_grad()`` and ``state_dict()``.
    Build it after ``shard_hybrid``: FSDP2 replaced the dense parameters with DTensors, and an optimizer
    built before would hold the old tensors (which no longer receive gradients).
    """
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    dense = KeyedOptimizerWrapper(
        dict(in_backward_optimizer_filter(model.named_parameters())),
        lambda params: torch.optim.Adam(params, lr=dense_learning_rate),
    )
    fused = getattr(model, "fused_optimizer", None)
    return CombinedOptimizer([fused, dense]) if fused is not None else dense


def memory_by_part(model: nn.Module, optimizer: Any = None) -> dict[str, memory.RankMemory]:
    """Bytes this rank holds now for the ``"embeddings"`` (every parameter inside a sharded module, with the
    fused optimizer's state) and for the ``"dense"`` rest: parameters, gradients, optimizer state each.

    Only local data counts: a rank's shards of a sharded table, the local shard of a DTensor, a replica in
    full. Measure between steps, after ``optimizer.step()`` (see ``course_lib.memory``).
    """
    sharded = {id(p) for m in model.modules() if isinstance(m, ShardedModule) for p in m.parameters()}
    params = {"embeddings": [], "dense": []}
    seen: set[int] = set()
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            params["embeddings" if id(p) in sharded else "dense"].append(p)
    dense_ids = {id(p) for p in params["dense"]}
    state = {"embeddings": 0, "dense": 0}
    for key, values in (optimizer.state.items() if optimizer is not None else ()):
        part = "dense" if id(key) in dense_ids else "embeddings"  # fused state is keyed by table, not parameter
        state[part] += sum(memory.tensor_bytes(v) for name, v in values.items() if isinstance(v, torch.Tensor) and name != "step")
    return {
        part: memory.RankMemory(
            params=sum(memory.tensor_bytes(p) for p in ps),
            grads=sum(memory.tensor_bytes(p.grad) for p in ps if p.grad is not None),
            optimizer=state[part],
        )
        for part, ps in params.items()
    }
