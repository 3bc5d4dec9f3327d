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


class TinyTransformer(nn.Module):
    """A small decoder-only language model: token and position embeddings, ``n_layers`` causal pre-norm
    self-attention blocks, a final LayerNorm and a linear head to next-token logits.

    The blocks live in ``self.layers`` (an ``nn.ModuleList`` of ``nn.TransformerEncoderLayer``), the unit
    that FSDP shards one at a time, as in torchtitan's models; nothing here knows about ranks. No dropout,
    so two runs from the same seed compute the same numbers.

    Args:
        vocab_size, d_model, n_heads, n_layers: the usual sizes; ``ffn_dim`` defaults to ``4 * d_model``.
        max_seq_len: the longest sequence the position embedding covers.
        tie_weights: share one matrix between the token embedding and the output head.
        device: where to build the parameters (``"meta"`` for shapes only).

    ``forward(tokens)`` takes int64 ``[B, T]`` (T <= max_seq_len) and returns ``[B, T, vocab_size]``.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 4,
        ffn_dim: int | None = None,
        max_seq_len: int = 64,
        tie_weights: bool = False,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of n_heads={n_heads}")
        self.max_seq_len = max_seq_len
        self.tok_embeddings = nn.Embedding(vocab_size, d_model, device=device)
        self.pos_embeddings = nn.Embedding(max_seq_len, d_model, device=device)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(
                d_model, n_heads, ffn_dim or 4 * d_model, dropout=0.0, batch_first=True, norm_first=True,
                device=device,
            )
            for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model, device=device)
        self.output = nn.Linear(d_model, vocab_size, bias=False, device=device)
        if tie_weights:
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        seq_len = tokens.shape[1]
        if seq_len > self.max_seq_len:
            raise ValueError(f"sequence length {seq_len} exceeds max_seq_len={self.max_seq_len}")
        positions = torch.arange(seq_len, device=tokens.device)
        h = self.tok_embeddings(tokens) + self.pos_embeddings(positions)
        mask = nn.Transformer.generate_square_subsequent_mask(seq_len, device=tokens.device, dtype=h.dtype)
        for layer in self.layers:
            h = layer(h, src_mask=mask, is_causal=True)
        return self.output(self.norm(h))


class TiedEncoderDecoder(nn.Module):
    """A small encoder-decoder laid out like T5: one token embedding, ``shared``, feeds the encoder and the
    decoder, and is the output head's weight too (``lm_head.weight is shared.weight``).

    The blocks live in two lists: ``encoder`` (``nn.TransformerEncoderLayer``) and ``decoder``
    (``nn.TransformerDecoderLayer``: causal self-attention, then cross-attention to the encoder's output). A
    learned ``positions`` embedding and the two final norms belong to the model itself. No dropout.

    ``forward(source, target)`` takes int64 ``[B, S]`` and ``[B, T]`` (both at most ``max_seq_len``) and returns
    ``[B, T, vocab_size]``: logits for the next target token.
    """

    def __init__(
        self,
        vocab_size: int = 64,
        d_model: int = 32,
        n_heads: int = 2,
        n_encoder_layers: int = 2,
        n_decoder_layers: int = 2,
        max_seq_len: int = 16,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        self.shared = nn.Embedding(vocab_size, d_model, device=device)
        self.positions = nn.Embedding(max_seq_len, d_model, device=device)
        options = {"dropout": 0.0, "batch_first": True, "norm_first": True, "device": device}
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, n_heads, 4 * d_model, **options) for _ in range(n_encoder_layers)
        )
        self.decoder = nn.ModuleList(
            nn.TransformerDecoderLayer(d_model, n_heads, 4 * d_model, **options) for _ in range(n_decoder_layers)
        )
        self.encoder_norm = nn.LayerNorm(d_model, device=device)
        self.decoder_norm = nn.LayerNorm(d_model, device=device)
        self.lm_head = nn.Linear(d_model, vocab_size, bias=False, device=device)
        self.lm_head.weight = self.shared.weight

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.shared(tokens) + self.positions(torch.arange(tokens.shape[1], device=tokens.device))

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        memory = self._embed(source)
        for block in self.encoder:
            memory = block(memory)
        memory = self.encoder_norm(memory)
        length = target.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=target.device, dtype=memory.dtype)
        h = self._embed(target)
        for block in self.decoder:
            h = block(h, memory, tgt_mask=mask, tgt_is_causal=True)
        return self.lm_head(self.decoder_norm(h))


def next_token_loss(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of predicting ``tokens[:, t + 1]`` from ``logits[:, t]``."""
    return nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), tokens[:, 1:].flatten())


def counting_tokens(batch_size: int, seq_len: int, vocab_size: int = 256, seed: int = 0) -> torch.Tensor:
    """``[batch_size, seq_len]`` int64 sequences that count up by one (mod vocab_size) from random starts:
    a task a TinyTransformer learns in a few steps, so a falling loss shows training works."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, vocab_size, (batch_size, 1), generator=generator)
    return (starts + torch.arange(seq_len)) % vocab_size


def click_dlrm(
    tables: Sequence[EmbeddingBagConfig],
    num_dense: int,
    hidden: int = 32,
    device: torch.device | str | None = None,
) -> nn.Module:
    """torchrec's own DLRM (``torchrec.models.dlrm``) for a click log, wrapped in its ``DLRMTrain``.

    The dense features go through a ``[hidden, embedding_dim]`` MLP, every pair of pooled embeddings (and
    the dense vector) meet in a dot product, and a ``[hidden, 1]`` MLP turns them into a logit.
    ``DLRMTrain`` puts the loss inside the model: ``forward(batch)`` takes a
    ``torchrec.datasets.utils.Batch`` and returns ``(loss, (loss.detach(), logits.detach(), labels))``, the
    form that ``TrainPipelineSparseDist`` drives. All tables must share one ``embedding_dim`` (DLRM's dot
    products need it). ``device="meta"`` builds shapes only, for DistributedModelParallel.
    """
    from torchrec.models.dlrm import DLRM, DLRMTrain

    tables = list(tables)
    dims = {table.embedding_dim for table in tables}
    if len(dims) != 1:
        raise ValueError(f"DLRM needs one embedding_dim for all tables, got {sorted(dims)}")
    device = torch.device(device) if device is not None else torch.device("cpu")
    dlrm = DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables, device=device),
        dense_in_features=num_dense,
        dense_arch_layer_sizes=[hidden, dims.pop()],
        over_arch_layer_sizes=[hidden, 1],
        dense_device=device,
    )
    return DLRMTrain(dlrm)
