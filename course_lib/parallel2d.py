"""Lab 12: sequence embeddings sharded by TorchRec, and a transformer split two ways (FSDP2 x tensor parallel).

    rows = launch(parallel2d.sequence_lookup, "row_wise", "fused", world_size=2)   # sharded EC == unsharded EC
    report = launch(parallel2d.train_2d, parallel2d.tp_plan(), world_size=4)       # 2 x 2 mesh vs one process

The transformer here is written the torchtitan way: every projection is its own ``nn.Linear`` (``wq``, ``wk``,
``wv``, ``wo``; ``w1``, ``w2``), and attention infers its number of heads from the tensor it gets
(``view(B, T, -1, head_dim)``), so the same block runs whole or with its heads split over tensor-parallel
ranks. Nothing in the model knows about ranks: :func:`apply_2d` parallelizes it from outside.
"""
from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

__all__ = [
    "activation_report",
    "Attention",
    "FeedForward",
    "GatedBlock",
    "GatedFeedForward",
    "TowerBlock",
    "Tower",
    "apply_2d",
    "param_bytes",
    "sequence_lookup",
    "sharding_group_estimates",
    "tp_plan",
    "train_2d",
]


class Attention(nn.Module):
    """Causal self-attention with separate q, k, v, o projections; heads = (output width) / head_dim."""

    def __init__(self, dim: int, n_heads: int) -> None:
        super().__init__()
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (w(x).view(b, t, -1, self.head_dim).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """``w2(gelu(w1(x)))``."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.gelu(self.w1(x)))


class TowerBlock(nn.Module):
    """A pre-norm transformer block: ``x + attention(norm(x))``, then ``x + feed_forward(norm(x))``."""

    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.LayerNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.LayerNorm(dim)
        self.feed_forward = FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class GatedFeedForward(nn.Module):
    """Llama's gated feed-forward (SwiGLU): ``w2(silu(w1(x)) * w3(x))``, its Linears registered as Llama's are:
    w1, w2, w3."""

    def __init__(self, dim: int, hidden: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class GatedBlock(nn.Module):
    """A block of Llama's shape: RMSNorms, the same :class:`Attention`, and a :class:`GatedFeedForward`; its
    submodules have :class:`TowerBlock`'s names."""

    def __init__(self, dim: int, n_heads: int, hidden: int) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(dim)
        self.attention = Attention(dim, n_heads)
        self.ffn_norm = nn.RMSNorm(dim)
        self.feed_forward = GatedFeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.ffn_norm(x))


class Tower(nn.Module):
    """``n_layers`` blocks and a final LayerNorm over ``[B, T, dim]`` inputs (a sequence of embeddings); `block` is
    the class of the blocks, :class:`TowerBlock` unless told."""

    def __init__(self, dim: int = 32, n_heads: int = 4, hidden: int = 64, n_layers: int = 2,
                 block: type[nn.Module] | None = None) -> None:
        super().__init__()
        block = block or TowerBlock
        self.layers = nn.ModuleList(block(dim, n_heads, hidden) for _ in range(n_layers))
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def tp_plan() -> dict[str, Any]:
    """The tensor-parallel plan of one :class:`TowerBlock`, as torchtitan writes it for Llama.

    q, k, v and w1 split their output features (column-wise: each rank computes some heads, some hidden
    units); wo and w2 split their input features (row-wise) and all-reduce their outputs, so each
    attention and each feed-forward costs one all-reduce in the forward; in the backward each column-wise
    layer all-reduces its input's gradient (q, k, v and w1: 4 per block).
    """
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(),
        "feed_forward.w1": ColwiseParallel(),
        "feed_forward.w2": RowwiseParallel(),
    }


def apply_2d(model: Tower, mesh: Any, plan: Mapping[str, Any]) -> Tower:
    """Tensor-parallel each block over ``mesh["tp"]`` with ``plan``, then FSDP2 over ``mesh["dp"]``: each block,
    then the root (torchtitan's order: TP first, so FSDP shards the already tensor-parallel DTensors)."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    for block in model.layers:
        parallelize_module(block, mesh["tp"], dict(plan))
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return model


def param_bytes(model: nn.Module) -> int:
    """Bytes of the parameters this rank holds (its local shards, for DTensor parameters)."""
    total = 0
    for p in model.parameters():
        local = p.to_local() if hasattr(p, "to_local") else p
        total += local.numel() * local.element_size()
    return total


def train_2d(
    plan: Mapping[str, Any], steps: int = 3, batch: int = 4, seq_len: int = 8, dim: int = 32, lr: float = 0.1,
    mesh_shape: tuple[int, int] = (2, 2), block: type[nn.Module] | None = None,
) -> dict[str, Any]:
    """Run on every rank of a ``dp x tp`` group: train a :class:`Tower` split by ``plan`` over TP and FSDP2
    over DP beside a single-process copy, with SGD; report how far apart they are. `block` is the class of the
    tower's blocks (:class:`TowerBlock` unless told, or :class:`GatedBlock`).

    Each data-parallel replica takes its slice of one global batch; its tensor-parallel ranks share it.
    Returns the largest loss and parameter differences over the steps, this rank's placements and
    parameter bytes, the unsharded model's bytes, and the collectives of the first forward.
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from course_lib import trace

    start = time.perf_counter()
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    reference = Tower(dim=dim, block=block)
    model = Tower(dim=dim, block=block)
    model.load_state_dict(reference.state_dict())
    full_bytes = param_bytes(reference)
    apply_2d(model, mesh, plan)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=lr)
    dp, dp_size = mesh["dp"].get_local_rank(), mesh_shape[0]
    local = batch // dp_size
    generator = torch.Generator().manual_seed(1)
    loss_diff = param_diff = 0.0
    records: list[Any] = []
    for step in range(steps):
        x = torch.randn(batch, seq_len, dim, generator=generator)
        if step == 0:  # what one forward runs: FSDP's all-gathers over dp, TP's all-reduces over tp
            with trace.collectives() as log:
                with log.phase("forward"):
                    loss = model(x[dp * local : (dp + 1) * local]).pow(2).mean()
            records = log.records
        else:
            loss = model(x[dp * local : (dp + 1) * local]).pow(2).mean()
        reference_loss = reference(x).pow(2).mean()
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss, group=mesh["dp"].get_group())
        loss_diff = max(loss_diff, abs(mean_loss.item() / dp_size - reference_loss.item()))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reference_loss.backward()
        reference_optimizer.step()
        reference_optimizer.zero_grad()
        param_diff = max(
            param_diff,
            max(float((p.full_tensor() - r).abs().max()) for p, r in zip(model.parameters(), reference.parameters())),
        )
    return {
        "loss_diff": loss_diff,
        "param_diff": param_diff,
        "placements": {n: tuple(str(pl) for pl in p.placements) for n, p in model.named_parameters()},
        "param_bytes": param_bytes(model),
        "full_bytes": full_bytes,
        "forward_collectives": records,
        "seconds": time.perf_counter() - start,
    }


def sequence_lookup(sharding: str, kernel: str, num_embeddings: int = 100, dim: int = 8) -> dict[str, Any]:
    """Run on every rank: an EmbeddingCollection (sequence embeddings, no pooling) sharded by DMP with
    ``sharding`` ("table_wise" or "row_wise") and ``kernel``, against the unsharded module on the same ids.

    Returns the largest difference of the looked-up vectors, the lengths of the result (one vector per id),
    and the collectives of the forward (``course_lib.trace`` records).
    """
    import torch.distributed as dist
    from torchrec import EmbeddingCollection, EmbeddingConfig, KeyedJaggedTensor
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise, table_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    from course_lib import trace

    rank, world = dist.get_rank(), dist.get_world_size()
    tables = [EmbeddingConfig(name="t_item", embedding_dim=dim, num_embeddings=num_embeddings, feature_names=["history"])]
    torch.manual_seed(0)
    reference = EmbeddingCollection(tables=tables)
    generator = {"table_wise": lambda: table_wise(rank=0, compute_kernel=kernel),
                 "row_wise": lambda: row_wise(compute_kernel=kernel)}[sharding]()
    sharder = EmbeddingCollectionSharder()
    plan = construct_module_sharding_plan(
        EmbeddingCollection(tables=tables, device=torch.device("meta")), per_param_sharding={"t_item": generator},
        sharder=sharder, local_size=world, world_size=world, device_type="cpu",
    )
    model = DistributedModelParallel(
        EmbeddingCollection(tables=tables, device=torch.device("meta")), env=ShardingEnv.from_process_group(dist.group.WORLD),
        device=torch.device("cpu"), plan=ShardingPlan({"": plan}), sharders=[sharder],
    )
    model.load_state_dict(reference.state_dict())
    g = torch.Generator().manual_seed(rank)
    lengths = torch.randint(1, 5, (3,), generator=g)
    ids = KeyedJaggedTensor(keys=["history"], values=torch.randint(0, num_embeddings, (int(lengths.sum()),), generator=g),
                            lengths=lengths)
    with trace.collectives() as log:
        with log.phase("forward"):
            out = model(ids)
            out = out.wait() if hasattr(out, "wait") else out
    want = reference(ids)
    return {
        "max_diff": float((out["history"].values() - want["history"].values()).abs().max()),
        "lengths": out["history"].lengths().tolist(),
        "vectors": tuple(out["history"].values().shape),
        "records": log.records,
    }


def activation_report(checkpointing: bool, seq_len: int = 256, batch: int = 4, dim: int = 32,
                      offload: str | None = None) -> dict[str, Any]:
    """Run on every rank: one forward and backward of an FSDP2-sharded :class:`Tower`, measuring what autograd
    saves for backward (activations, not parameters) and how often each block's forward runs.

    ``checkpointing=True`` wraps each block in activation checkpointing (the composable ``checkpoint``, applied
    before ``fully_shard``): a block keeps only its input and runs its forward again during backward.
    ``offload="pinned"`` / ``"unpinned"`` adds FSDP2's ``CPUOffloadPolicy`` (with ``pin_memory`` True / False).
    Returns the saved bytes, the forward calls per block, the gradients' distance to a plain single-process
    run, the parameters' device, and the error if the setup failed.
    """
    from torch.distributed._composable import checkpoint
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

    torch.manual_seed(0)
    reference = Tower(dim=dim)
    model = Tower(dim=dim)
    model.load_state_dict(reference.state_dict())
    calls = [0] * len(model.layers)
    for i, block in enumerate(model.layers):  # counted inside the block: a recomputation runs it again
        run = block.feed_forward.forward

        def counted(*args: Any, i: int = i, run: Any = run) -> Any:
            calls[i] += 1
            return run(*args)

        block.feed_forward.forward = counted
    policy = {"pinned": lambda: CPUOffloadPolicy(), "unpinned": lambda: CPUOffloadPolicy(pin_memory=False)}
    try:
        kwargs = {"offload_policy": policy[offload]()} if offload else {}
        for block in model.layers:
            if checkpointing:
                checkpoint(block)
            fully_shard(block, **kwargs)
        fully_shard(model, **kwargs)
    except Exception as error:  # CPUOffloadPolicy's default pin_memory=True needs an accelerator
        return {"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}
    saved = [0]

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.grad_fn is not None or not t.requires_grad:  # activations and inputs; not the (leaf) weights
            saved[0] += t.numel() * t.element_size()
        return t

    x = torch.randn(batch, seq_len, dim, generator=torch.Generator().manual_seed(1))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x).pow(2).mean()
    forward_calls = list(calls)
    loss.backward()
    reference(x).pow(2).mean().backward()
    grad_diff = max(float((p.grad.full_tensor() - r.grad).abs().max())
                    for p, r in zip(model.parameters(), reference.parameters()))
    return {
        "saved_bytes": saved[0],
        "forward_calls": forward_calls,
        "calls_after_backward": list(calls),
        "grad_diff": grad_diff,
        "param_device": str(next(model.parameters()).device),
    }


def sharding_group_estimates(world_sizes: tuple[int, ...] = (64, 8), ranks_per_host: int = 8,
                             hbm_gib: float = 80) -> list[dict[str, Any]]:
    """The planner's own estimates for one set of tables (5 x 10M and 5 x 1M rows, 128 wide) sharded over
    each of ``world_sizes`` GPUs (hosts of ``ranks_per_host``): plain DMP over the whole cluster against one
    DMPCollection sharding group. Per plan: the largest HBM per rank (GiB), the busiest rank's embedding
    communication (ms per step, forward + backward) and the sharding types the planner chose. Plans only:
    nothing is allocated, no GPU is needed."""
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from course_lib import planning

    tables = [EmbeddingBagConfig(name=f"t{i}", embedding_dim=128, num_embeddings=rows, feature_names=[f"f{i}"])
              for i, rows in enumerate([10_000_000] * 5 + [1_000_000] * 5)]
    rows = []
    for world in world_sizes:
        topology = planning.topology(world, local_world_size=min(ranks_per_host, world), compute_device="cuda",
                                     hbm_cap_bytes=int(hbm_gib * 2**30))
        estimates = planning.Estimates()
        EmbeddingShardingPlanner(topology=topology, callbacks=[estimates]).plan(
            planning.meta_ebc(tables), [EmbeddingBagCollectionSharder()])
        hbm, comms = estimates.per_rank(world)
        rows.append({"GPUs": world, "hosts": max(1, world // ranks_per_host), "max HBM GiB per rank": max(hbm),
                     "busiest rank's comms ms": max(comms),
                     "sharding types": ", ".join(sorted({o.sharding_type for o in estimates.options}))})
    return rows
