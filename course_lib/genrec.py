"""A generative (next-item) recommender: TorchRec-sharded item embeddings feeding an FSDP2-sharded transformer.

    report = launch(genrec.train_and_evaluate, data.HistoryConfig(), world_size=2)

One process group, two kinds of sharding: the item table is an ``EmbeddingCollection`` (one vector per id)
sharded row-wise by DistributedModelParallel with a fused row-wise Adagrad, and the transformer
(``parallel2d.Tower``) is sharded by ``fully_shard`` over the same ranks. A user's history of item ids goes
through the table, gets position embeddings, runs through the transformer, and the last position's output
scores the next item: during training against the other targets of the batch (in-batch sampled softmax),
at evaluation against every item (recall@10, NDCG@10).
"""
from __future__ import annotations

import math
import time
from typing import Any

import torch
from torch import nn

from course_lib import data, parallel2d

__all__ = ["NextItemModel", "metrics_at_k", "popularity_metrics", "reference_sampled_softmax", "train_and_evaluate"]


def reference_sampled_softmax(query: torch.Tensor, candidates: torch.Tensor, log_q: torch.Tensor,
                              temperature: float) -> torch.Tensor:
    """In-batch sampled softmax with the logQ correction.

    Row i of ``query`` should pick row i of ``candidates`` (its own next item) among all the batch's
    candidates. Logits are cosine similarities over ``temperature``, minus ``log_q[j]``, the log of the chance
    that candidate j's item is in a batch at all: popular items are negatives more often than rare ones,
    and without the correction the model learns to push them down.
    """
    logits = nn.functional.normalize(query, dim=1) @ nn.functional.normalize(candidates, dim=1).T / temperature
    return nn.functional.cross_entropy(logits - log_q[None, :], torch.arange(len(query)))


def metrics_at_k(scores: torch.Tensor, target: torch.Tensor, k: int = 10) -> tuple[float, float]:
    """Sums over rows of recall@k and NDCG@k for one target per row (divide by the rows for the means)."""
    top = scores.topk(k, dim=1).indices
    hit = top == target[:, None]
    rank = hit.float().argmax(1)
    found = hit.any(1)
    recall = float(found.float().sum())
    ndcg = float((found.float() / torch.log2(rank.float() + 2)).sum())
    return recall, ndcg


def popularity_metrics(histories: data.Histories, k: int = 10) -> tuple[float, float]:
    """recall@k and NDCG@k on the test users of ranking every item by its count among training targets."""
    _, train_target, _ = histories.split("train")
    _, test_target, _ = histories.split("test")
    counts = torch.bincount(train_target, minlength=histories.config.num_items).float()
    recall, ndcg = metrics_at_k(counts.expand(len(test_target), -1), test_target, k)
    return recall / len(test_target), ndcg / len(test_target)


class NextItemModel(nn.Module):
    """The dense part: position embeddings, a transformer over the history's item vectors, and the last
    position's output as the user's query vector (the item vectors come from the sharded table)."""

    def __init__(self, dim: int, history_len: int, n_layers: int = 2, n_heads: int = 4) -> None:
        super().__init__()
        self.positions = nn.Parameter(torch.randn(history_len, dim) * 0.02)
        self.tower = parallel2d.Tower(dim=dim, n_heads=n_heads, hidden=2 * dim, n_layers=n_layers)

    def forward(self, item_vectors: torch.Tensor) -> torch.Tensor:
        return self.tower(item_vectors + self.positions)[:, -1]


def _kjt(feature: str, ids: torch.Tensor) -> Any:
    from torchrec import KeyedJaggedTensor

    ids = ids.reshape(len(ids), -1)
    return KeyedJaggedTensor(keys=[feature], values=ids.flatten(),
                             lengths=torch.full((len(ids),), ids.shape[1], dtype=torch.long))


def train_and_evaluate(
    config: data.HistoryConfig, dim: int = 32, steps: int = 200, batch_size: int = 64, lr: float = 3e-3,
    embedding_lr: float = 0.05, temperature: float = 0.1, k: int = 10, negatives: str = "all",
    loss_fn: Any = None,
) -> dict[str, Any]:
    """Run on every rank: shard, train ``steps`` steps of next-item prediction, evaluate on the test users.

    Each step every rank takes its own ``batch_size`` training users. ``negatives="all"`` scores each target
    against every item (a full softmax: cheap with a few hundred items); ``"in_batch"`` only against the
    other targets of the batch (sampled softmax, what large catalogs use); ``"in_batch_logq"`` subtracts from
    each candidate's logit the log of its chance to appear in a batch (the logQ correction). ``loss_fn``
    computes the in-batch loss (default :func:`reference_sampled_softmax`). Returns (the same on every rank) the
    test recall@k and NDCG@k, the loss curve of rank 0, how the parameters are sharded, and the time.
    """
    import torch.distributed as dist
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torch.distributed.fsdp import fully_shard
    from torchrec import EmbeddingCollection, EmbeddingConfig
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan, row_wise
    from torchrec.distributed.types import ShardingEnv, ShardingPlan

    if negatives not in ("all", "in_batch", "in_batch_logq"):
        raise ValueError(f"negatives must be 'all', 'in_batch' or 'in_batch_logq', got {negatives!r}")
    loss_fn = loss_fn or reference_sampled_softmax
    start = time.perf_counter()
    rank, world = dist.get_rank(), dist.get_world_size()
    histories = data.make_histories(config)
    _, _, train_probs = histories.split("train")
    marginal = train_probs.mean(0)  # how often each item is a target, over the training users
    torch.manual_seed(0)
    tables = [EmbeddingConfig(name="t_item", embedding_dim=dim, num_embeddings=config.num_items,
                              feature_names=["items"])]
    sharder = EmbeddingCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD,
                                                       "learning_rate": embedding_lr})
    meta = EmbeddingCollection(tables=tables, device=torch.device("meta"))
    plan = construct_module_sharding_plan(meta, per_param_sharding={"t_item": row_wise(compute_kernel="fused")},
                                          sharder=sharder, local_size=world, world_size=world, device_type="cpu")
    items = DistributedModelParallel(EmbeddingCollection(tables=tables, device=torch.device("meta")),
                                     env=ShardingEnv.from_process_group(dist.group.WORLD), device=torch.device("cpu"),
                                     plan=ShardingPlan({"": plan}), sharders=[sharder])
    model = NextItemModel(dim, config.history_len)
    for block in model.tower.layers:
        fully_shard(block)
    fully_shard(model)
    sharded = {name: type(p).__name__ for name, p in model.named_parameters()}
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)

    def lookup(ids: torch.Tensor) -> torch.Tensor:
        out = items(_kjt("items", ids))
        out = out.wait() if hasattr(out, "wait") else out
        return out["items"].values().view(*ids.shape, dim)

    generator = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        # fresh draws from the training users' planted distributions: a log that keeps coming, never repeated
        users = torch.randint(0, len(train_probs), (batch_size,), generator=generator)
        drawn = torch.multinomial(train_probs[users], config.history_len + 1, replacement=True, generator=generator)
        history, target = drawn[:, :-1], drawn[:, -1]
        if negatives == "all":
            query, candidates = model(lookup(history)), lookup(torch.arange(config.num_items))
            logits = nn.functional.normalize(query, dim=1) @ nn.functional.normalize(candidates, dim=1).T / temperature
            loss = nn.functional.cross_entropy(logits, target)
        else:
            vectors = lookup(drawn)
            query, candidates = model(vectors[:, :-1]), vectors[:, -1]
            log_q = torch.log(marginal[target]) if negatives == "in_batch_logq" else torch.zeros(batch_size)
            loss = loss_fn(query, candidates, log_q, temperature)
        optimizer.zero_grad()
        loss.backward()  # the item table updates here (fused); the transformer's gradients are reduce-scattered
        optimizer.step()
        losses.append(loss.item())

    # evaluation: every rank scores its share of the test users against every item
    test_history, test_target, _ = histories.split("test")
    mine = slice(rank * len(test_history) // world, (rank + 1) * len(test_history) // world)
    with torch.no_grad():
        all_items = nn.functional.normalize(lookup(torch.arange(config.num_items)), dim=1)
        query = nn.functional.normalize(model(lookup(test_history[mine])), dim=1)
        recall, ndcg = metrics_at_k(query @ all_items.T, test_target[mine], k)
    totals = torch.tensor([recall, ndcg, float(len(test_target[mine]))])
    dist.all_reduce(totals)
    return {
        "recall": float(totals[0] / totals[2]),
        "ndcg": float(totals[1] / totals[2]),
        "losses": losses,
        "log_batch": math.log(batch_size),
        "table": type(items.module).__name__,
        "dense_parameter_types": sorted(set(sharded.values())),
        "seconds": time.perf_counter() - start,
    }
