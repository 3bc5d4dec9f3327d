"""course_lib.data: a seeded click log with a planted truth, exact AUCs, rank-sharded batches, the Criteo layout."""
from __future__ import annotations

import pytest
import torch
from torchrec.datasets.utils import Batch

from course_lib import data

SMALL = data.ClickLogConfig(num_train=3_000, num_test=2_000, seed=5)


@pytest.fixture(scope="module")
def log() -> data.ClickLog:
    return data.make_click_log(SMALL)


def splits_equal(a: data.ClickSplit, b: data.ClickSplit) -> bool:
    return (
        torch.equal(a.counts, b.counts)
        and torch.equal(a.labels, b.labels)
        and torch.equal(a.true_logits, b.true_logits)
        and a.ids.keys() == b.ids.keys()
        and all(torch.equal(x, y) for f in a.ids for x, y in zip(a.ids[f], b.ids[f]))
    )


def test_the_same_config_gives_the_same_log_and_another_seed_another(log):
    assert splits_equal(data.make_click_log(SMALL).train, log.train)
    other = data.make_click_log(data.ClickLogConfig(num_train=3_000, num_test=2_000, seed=6))
    assert not torch.equal(other.train.labels, log.train.labels)


def test_features_fit_their_tables_and_labels_follow_the_true_logits(log):
    config = log.config
    for split, n in ((log.train, config.num_train), (log.test, config.num_test)):
        assert len(split) == n and split.counts.shape == (n, config.num_dense)
        assert (split.counts >= 0).all() and set(split.labels.unique().tolist()) == {0, 1}
        for feature, rows in config.num_embeddings.items():
            values, lengths = split.ids[feature]
            assert lengths.shape == (n,) and int(lengths.sum()) == values.numel()
            assert 0 <= int(values.min()) and int(values.max()) < rows
        assert int(split.ids["terms"][1].max()) <= config.max_terms
        assert (split.ids["user"][1] == 1).all()
        assert torch.equal(log.truth.logits(split.counts, split.ids), split.true_logits)
    # the click rate is what the true logits say it should be
    rate = torch.sigmoid(log.train.true_logits.double()).mean().item()
    assert abs(log.train.labels.float().mean().item() - rate) < 0.03


def test_auc_is_exact_with_ties_and_matches_torchmetrics():
    from torchmetrics.classification import BinaryAUROC

    assert data.auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), torch.tensor([0, 0, 1, 1])) == 1.0
    assert data.auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), torch.tensor([0, 0, 1, 1])) == 0.0
    assert data.auc(torch.tensor([0.5, 0.5, 0.5]), torch.tensor([0, 1, 1])) == 0.5
    # one tie between a click and a non-click counts one half: (1 + 1 + 0.5 + 1) / 4
    assert data.auc(torch.tensor([0.1, 0.5, 0.5, 0.9]), torch.tensor([0, 0, 1, 1])) == 0.875
    generator = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 20, (2_000,), generator=generator).double()  # many ties
    labels = torch.randint(0, 2, (2_000,), generator=generator)
    clicks, others = scores[labels == 1], scores[labels == 0]
    pairs = (clicks[:, None] > others).sum() + 0.5 * (clicks[:, None] == others).sum()
    assert data.auc(scores, labels) == pytest.approx(pairs.item() / (len(clicks) * len(others)), abs=1e-12)
    assert data.auc(scores, labels) == pytest.approx(float(BinaryAUROC()(scores, labels)), abs=1e-7)
    with pytest.raises(ValueError, match="one click and one non-click"):
        data.auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))


def test_bayes_optimal_auc_is_the_auc_of_the_true_logits_and_beats_noisier_scores(log):
    split = log.test
    assert data.bayes_optimal_auc(split) == data.auc(torch.sigmoid(split.true_logits), split.labels)
    generator = torch.Generator().manual_seed(1)
    noisy = split.true_logits + torch.randn(len(split), generator=generator)
    assert data.auc(noisy, split.labels) < data.bayes_optimal_auc(split)
    assert 0.7 < data.bayes_optimal_auc(split) < 0.9


def test_batches_split_each_step_across_ranks_without_overlap(log):
    split, batch_size, world_size = log.train, 64, 3
    per_rank = [list(data.batches(split, batch_size, rank, world_size)) for rank in range(world_size)]
    steps = len(split) // (batch_size * world_size)
    assert [len(b) for b in per_rank] == [steps] * world_size
    first = per_rank[1][0]
    assert isinstance(first, Batch)
    assert torch.equal(first.labels, split.labels[batch_size : 2 * batch_size])
    assert torch.equal(first.dense_features, split.dense[batch_size : 2 * batch_size])
    kjt = first.sparse_features
    assert kjt.keys() == ["user", "item", "category", "terms"] and kjt.stride() == batch_size
    assert kjt["terms"].to_dense()[0].tolist() == split.rows(batch_size, batch_size + 1).ids["terms"][0].tolist()


def test_batches_without_drop_last_cover_every_row_once(log):
    split, batch_size, world_size = log.test, 300, 2  # 2000 rows: 3 full steps, a tail of 200
    per_rank = [list(data.batches(split, batch_size, r, world_size, drop_last=False)) for r in range(world_size)]
    assert len(per_rank[0]) == len(per_rank[1]) == 4
    sizes = [[len(b.labels) for b in batches] for batches in per_rank]
    assert sizes == [[300, 300, 300, 100]] * 2
    assert sum(map(sum, sizes)) == len(split)
    tiny = [[len(b.labels) for b in data.batches(split.rows(0, 2), 500, r, 3, drop_last=False)] for r in range(3)]
    assert tiny == [[1], [1], [0]]  # fewer rows than ranks: rank 2 gets an empty batch, to stay in step
    with pytest.raises(ValueError):
        next(data.batches(split, 0))


def test_criteo_tsv_round_trip_through_torchrecs_reader(log, tmp_path):
    part = log.test.rows(0, 300)
    path = data.write_criteo_tsv(part, tmp_path / "day_0.tsv")
    lines = path.read_text().splitlines()
    assert len(lines) == 300
    fields = lines[0].split("\t")
    assert len(fields) == 1 + data.CRITEO_INT_COLUMNS + data.CRITEO_CAT_COLUMNS
    assert fields[1 + data.CRITEO_INT_COLUMNS] == f"{int(part.ids['user'][0][0]):08x}"
    assert fields[1 + log.config.num_dense] == ""  # unused integer columns are empty
    back = data.read_criteo_tsv(path, log)
    assert splits_equal(back, part)
    assert data.bayes_optimal_auc(back) == data.bayes_optimal_auc(part)


def test_config_rejects_layouts_the_criteo_format_cannot_hold():
    with pytest.raises(ValueError, match="num_dense"):
        data.ClickLogConfig(num_dense=14)
    with pytest.raises(ValueError, match="max_terms"):
        data.ClickLogConfig(max_terms=24)
    with pytest.raises(ValueError, match="num_users"):
        data.ClickLogConfig(num_users=0)


def test_tables_follow_the_config():
    tables = data.ClickLogConfig(num_users=7).tables(embedding_dim=4)
    assert [(t.name, t.num_embeddings, t.embedding_dim, t.feature_names) for t in tables][:2] == [
        ("t_user", 7, 4, ["user"]),
        ("t_item", 200, 4, ["item"]),
    ]
