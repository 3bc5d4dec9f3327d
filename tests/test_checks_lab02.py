"""The 02_embeddings checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from course_lib.checks import CheckFailed, lab02

# ------------------------------------------------------------------------------------------ exercise 1


def kjt_key_major(samples, keys):
    values, lengths = [], []
    for key in keys:
        for sample in samples:
            values.extend(sample[key])
            lengths.append(len(sample[key]))
    return KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values, dtype=torch.long),
                             lengths=torch.tensor(lengths, dtype=torch.long))


def kjt_sample_major(samples, keys):
    values, lengths = [], []
    for sample in samples:
        for key in keys:
            values.extend(sample[key])
            lengths.append(len(sample[key]))
    return KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values, dtype=torch.long),
                             lengths=torch.tensor(lengths, dtype=torch.long))


def kjt_dict_order_keys(samples, keys):
    return kjt_key_major(samples, list(samples[0]))


def kjt_dict_order_values(samples, keys):
    built = kjt_key_major(samples, list(samples[0]))  # values/lengths in dict order ...
    return KeyedJaggedTensor(keys=list(keys), values=built.values(), lengths=built.lengths())  # ... declared as `keys`


def kjt_float_values(samples, keys):
    built = kjt_key_major(samples, keys)
    return KeyedJaggedTensor(keys=list(keys), values=built.values().float(), lengths=built.lengths())


def kjt_skips_empty_bags(samples, keys):
    values, lengths = [], []
    for key in keys:
        for sample in samples:
            if sample[key]:
                values.extend(sample[key])
                lengths.append(len(sample[key]))
    return KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values, dtype=torch.long),
                             lengths=torch.tensor(lengths, dtype=torch.long))


def test_kjt_check_accepts_the_solution(capsys):
    lab02.check_kjt_from_samples(kjt_key_major)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (kjt_sample_major, "KEY-major"),
        (kjt_dict_order_keys, "order from the `keys` argument"),
        (kjt_dict_order_values, "dict order"),
        (kjt_float_values, "dtype"),
        (kjt_skips_empty_bags, "empty bags included"),
        (lambda samples, keys: {k: [s[k] for s in samples] for k in keys}, "return a torchrec.KeyedJaggedTensor"),
        (lambda samples, keys: 1 / 0, "ZeroDivisionError"),
    ],
)
def test_kjt_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_kjt_from_samples(wrong)


# ------------------------------------------------------------------------------------------ exercise 2


def test_width_check_accepts_the_solution(capsys):
    lab02.check_pooled_width(lambda tables: sum(t.embedding_dim * len(t.feature_names) for t in tables))
    assert capsys.readouterr().out.startswith("✓")


def test_width_check_accepts_the_library_helper(capsys):
    from course_lib.models import pooled_width

    lab02.check_pooled_width(pooled_width)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda tables: tables[0].embedding_dim, "one table's width"),  # only one table
        (lambda tables: max(t.embedding_dim for t in tables), "EmbeddingCollection"),  # EC-style, one dim
        (lambda tables: sum(t.embedding_dim for t in tables), "each FEATURE"),  # per table, shared features missed
        (lambda tables: sum(len(t.feature_names) for t in tables), "counted features"),
        (lambda tables: float(sum(t.embedding_dim * len(t.feature_names) for t in tables)), "return an int"),
    ],
)
def test_width_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_pooled_width(wrong)


# ------------------------------------------------------------------------------------------ exercise 3


def _tables():
    return [
        EmbeddingBagConfig(name="user_table", embedding_dim=128, num_embeddings=10_000, feature_names=["user_id"]),
        EmbeddingBagConfig(name="item_table", embedding_dim=128, num_embeddings=10_000, feature_names=["item_id"]),
    ]


class Fixed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=_tables(), device=torch.device("cpu"))
        self.linear = torch.nn.Linear(256, 1)

    def forward(self, x):
        return self.linear(self.ebc(x).values())


class Seed(Fixed):  # the tutorials' model: both bugs
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(512, 1)

    def forward(self, x):
        return self.linear(torch.cat([emb for emb in self.ebc(x).values()]))


class OnlyLinearFixed(Fixed):  # width fixed, rows still iterated
    def forward(self, x):
        return self.linear(torch.cat([emb for emb in self.ebc(x).values()]))


class OnlyRowsFixed(Seed):  # rows fixed, Linear still 512 wide
    def forward(self, x):
        return self.linear(self.ebc(x).values())


class OneTable(Fixed):  # runs, but feeds only one feature
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(128, 1)

    def forward(self, x):
        return self.linear(self.ebc(x).to_dict()["user_id"])


class Flattened(Fixed):  # one logit per sample, but [B] instead of [B, 1]
    def forward(self, x):
        return self.linear(self.ebc(x).values()).squeeze(1)


def test_model_check_accepts_the_solution(capsys):
    lab02.check_fixed_model(Fixed)
    assert capsys.readouterr().out.startswith("✓")


def test_model_check_accepts_the_library_model(capsys):
    from course_lib.models import SimpleRecModel

    lab02.check_fixed_model(SimpleRecModel)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (Seed, r"(?s)1x768 and 512x1.*ROWS.*size the Linear"),
        (OnlyLinearFixed, r"1x768 and 256x1\)\nhint: iterating"),
        (OnlyRowsFixed, r"3x256 and 512x1\)\nhint: the EBC gives 256"),
        (OneTable, "does not reach table 'item_table'"),
        (Flattened, r"output \(3,\), expected \(3, 1\)"),
    ],
)
def test_model_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_fixed_model(wrong)


def test_seed_with_a_batch_of_two_is_caught_as_silently_wrong():
    class SeedWidth256Rows(Seed):  # Linear(512) and rows: a batch of 2 runs and returns one number
        pass

    model = SeedWidth256Rows()
    assert model(lab02.rec_batch(2)).shape == (1,)  # the silent failure the lab shows


def test_rec_batch_is_key_major_and_deterministic():
    kjt = lab02.rec_batch(3)
    assert kjt.keys() == ["user_id", "item_id"] and kjt.stride() == 3
    assert torch.equal(kjt.values(), lab02.rec_batch(3).values())
