"""course_lib.models: the fixed SimpleRecModel, its width from the configs, and building on meta."""
from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor

from course_lib.models import SimpleRecModel, pooled_width, simple_rec_tables


def batch(keys, batch_size, num_embeddings=10, seed=0):
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, 3, (len(keys) * batch_size,), generator=generator)
    values = torch.randint(0, num_embeddings, (int(lengths.sum()),), generator=generator)
    return KeyedJaggedTensor(keys=list(keys), values=values, lengths=lengths)


def test_default_model_is_the_fixed_tutorial_model():
    model = SimpleRecModel(simple_rec_tables(num_embeddings=100))
    assert list(model.ebc.embedding_bags) == ["t_user_id", "t_item_id"]
    assert model.dense.in_features == 256  # two 128-dim tables, not the tutorials' 512
    for batch_size in (1, 2, 3):
        assert model(batch(["user_id", "item_id"], batch_size, 100)).shape == (batch_size, 1)


def test_width_follows_the_configs_including_shared_features():
    tables = [
        EmbeddingBagConfig(name="t_word", embedding_dim=4, num_embeddings=10, feature_names=["query", "title"]),
        EmbeddingBagConfig(name="t_city", embedding_dim=12, num_embeddings=10, feature_names=["city"]),
    ]
    assert pooled_width(tables) == 20
    model = SimpleRecModel(tables)
    kjt = batch(["query", "title", "city"], 5)
    assert model.ebc(kjt).values().shape == (5, 20)
    assert model(kjt).shape == (5, 1)


def test_config_without_feature_names_counts_its_own_name():
    assert pooled_width([EmbeddingBagConfig(name="t", embedding_dim=8, num_embeddings=3)]) == 8


def test_gradients_reach_every_table():
    model = SimpleRecModel(simple_rec_tables(num_embeddings=50, embedding_dim=8))
    model(batch(["user_id", "item_id"], 4, 50)).sum().backward()
    for name, bag in model.ebc.embedding_bags.items():
        assert bag.weight.grad is not None and bag.weight.grad.abs().sum() > 0, name


def test_builds_on_meta_without_memory():
    model = SimpleRecModel(simple_rec_tables(num_embeddings=50_000_000), device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}
    assert sum(p.numel() for p in model.parameters()) == 2 * 50_000_000 * 128 + 256 + 1


def test_no_tables_is_an_error():
    with pytest.raises(ValueError, match="at least one"):
        SimpleRecModel([])
