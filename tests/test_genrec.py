"""The generative recommender: the planted histories, the metrics, and a short sharded training run."""
from __future__ import annotations

import pytest
import torch

from course_lib import data, genrec, launch


def test_histories_are_seeded_and_their_ceiling_is_exact():
    config = data.HistoryConfig(num_users=400, test_users=100)
    h, again = data.make_histories(config), data.make_histories(config)
    assert torch.equal(h.history, again.history) and h.history.shape == (400, config.history_len)
    assert torch.allclose(h.probs.sum(1), torch.ones(400))
    # the ceiling is the mass of the k most likely items; with k = all items it is 1
    assert data.recall_ceiling(h.probs, k=config.num_items) == pytest.approx(1.0)
    assert data.recall_ceiling(h.probs, 1) < data.recall_ceiling(h.probs, 10) < 1
    # drawing targets from the planted distribution, the oracle's hit rate matches the ceiling
    draws = torch.multinomial(h.probs, 200, replacement=True, generator=torch.Generator().manual_seed(0))
    top = h.probs.topk(10, dim=1).indices
    hits = (draws[:, :, None] == top[:, None, :]).any(2).float().mean()
    assert float(hits) == pytest.approx(data.recall_ceiling(h.probs), abs=0.01)


def test_metrics_at_k():
    scores = torch.tensor([[0.9, 0.1, 0.5], [0.2, 0.3, 0.1]])
    recall, ndcg = genrec.metrics_at_k(scores, torch.tensor([2, 2]), k=2)
    assert recall == 1.0 and ndcg == pytest.approx(1 / torch.log2(torch.tensor(3.0)).item())


@pytest.mark.filterwarnings("ignore:launch")
def test_next_item_training_beats_popularity_only_with_the_right_negatives():
    config = data.HistoryConfig()
    pop_recall, _ = genrec.popularity_metrics(data.make_histories(config))
    runs = {n: launch(genrec.train_and_evaluate, config, negatives=n, steps=150, world_size=2, show_ranks=[])
            for n in ("in_batch", "in_batch_logq")}
    assert runs["in_batch"][0]["recall"] == runs["in_batch"][1]["recall"]  # every rank reports the same totals
    assert runs["in_batch"][0]["table"] == "ShardedEmbeddingCollection"
    assert runs["in_batch"][0]["dense_parameter_types"] == ["DTensor"]
    assert runs["in_batch_logq"][0]["recall"] > pop_recall > runs["in_batch"][0]["recall"]
    with pytest.raises(Exception, match="negatives must be"):
        launch(genrec.train_and_evaluate, config, negatives="hard", world_size=2, show_ranks=[])
