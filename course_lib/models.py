"""Small reference models, unsharded: plain ``nn.Module``s that a lab shards from outside.

Every model here builds on ``device="meta"`` (shapes only, no memory: what DistributedModelParallel wants
before it shards) as well as on ``"cpu"``. Nothing in this module knows about ranks or process groups.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor


def pooled_width(tables: Sequence[EmbeddingBagConfig]) -> int:
    """Width of an EmbeddingBagCollection's output row for these configs: ``KeyedTensor.values()`` is
    ``[B, pooled_width(tables)]``.

    Every feature gets its own pooled vector, so a table listed under two feature names counts twice.
    """
    return sum(table.embedding_dim * len(table.feature_names or [table.name]) for table in tables)


def simple_rec_tables(
    num_embeddings: int = 10_000, embedding_dim: int = 128, features: Sequence[str] = ("user_id", "item_id")
) -> list[EmbeddingBagConfig]:
    """One table per feature, all of one size: the two 128-dim tables of the tutorials' SimpleRecModel."""
    return [
        EmbeddingBagConfig(
            name=f"t_{feature}", embedding_dim=embedding_dim, num_embeddings=num_embeddings, feature_names=[feature]
        )
        for feature in features
    ]


class SimpleRecModel(nn.Module):
    """Pooled embeddings of sparse features, then one Linear layer to a logit per sample.

    The tutorials' version, fixed: the Linear's input width is derived from the table configs (two 128-dim
    tables give 256, not 512), and ``forward`` feeds the EBC's ``KeyedTensor.values()``, already the
    ``[B, sum of dims]`` concatenation of all features, straight to it (iterating ``.values()`` would walk
    its rows and mix the samples of a batch).

    Args:
        tables: the embedding tables; default ``simple_rec_tables()`` (features "user_id" and "item_id").
        device: where to build the parameters; ``torch.device("meta")`` builds shapes only.

    ``forward(features)`` takes a KeyedJaggedTensor with every table's feature names and returns ``[B, 1]``.
    """

    def __init__(
        self, tables: Sequence[EmbeddingBagConfig] | None = None, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        tables = list(tables) if tables is not None else simple_rec_tables()
        if not tables:
            raise ValueError("SimpleRecModel needs at least one EmbeddingBagConfig")
        device = torch.device(device) if device is not None else torch.device("cpu")
        self.ebc = EmbeddingBagCollection(tables=tables, device=device)
        self.dense = nn.Linear(pooled_width(tables), 1, device=device)

    def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(features).values()  # [B, sum of embedding dims]
        return self.dense(pooled)
