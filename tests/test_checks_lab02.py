"""The 02_embeddings checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import pytest
import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from course_lib.checks import CheckFailed, lab02

from conftest import rejects

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


# ------------------------------------------------------------------------------------------ exercise 3


def test_rec_batch_is_key_major_and_deterministic():
    kjt = lab02.rec_batch(3)
    assert kjt.keys() == ["user_id", "item_id"] and kjt.stride() == 3
    assert torch.equal(kjt.values(), lab02.rec_batch(3).values())


# ------------------------------------------------------------------------------------------ exercise 4


def shared_table(vocab_size, dim, budget_bytes):
    return [EmbeddingBagConfig(name="t_word", num_embeddings=vocab_size, embedding_dim=dim, feature_names=["query", "title"])]


def two_tables(vocab_size, dim, budget_bytes):
    return [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=vocab_size, embedding_dim=dim, feature_names=[f])
        for f in ("query", "title")
    ]


def decides_by_budget(vocab_size, dim, budget_bytes):
    if 2 * vocab_size * dim * 4 <= budget_bytes:
        return two_tables(vocab_size, dim, budget_bytes)
    return shared_table(vocab_size, dim, budget_bytes)


def decides_by_remaining_bytes(vocab_size, dim, budget_bytes):  # another right answer, written differently
    tables = two_tables(vocab_size, dim, budget_bytes)
    if sum(t.num_embeddings * t.embedding_dim * 4 for t in tables) > budget_bytes:
        return shared_table(vocab_size, dim, budget_bytes)
    return tables


def test_word_tables_check_accepts_a_budget_aware_choice(capsys):
    for right in (decides_by_budget, decides_by_remaining_bytes):
        lab02.check_word_tables(right)
        assert capsys.readouterr().out.startswith("✓")


def two_tables_when(rule):
    """A word_tables answer that picks a table per feature when `rule(vocab_size, dim, budget_bytes)` holds."""
    def answer(vocab_size, dim, budget_bytes):
        pick = two_tables if rule(vocab_size, dim, budget_bytes) else shared_table
        return pick(vocab_size, dim, budget_bytes)

    answer.__name__ = rule.__name__
    return answer


# rules the lab's own cases cannot tell from the budget's, each caught by a case of the check
def by_vocab_size(vocab_size, dim, budget_bytes):
    return vocab_size < 10_000


def by_vocab_up_to_20k(vocab_size, dim, budget_bytes):
    return vocab_size <= 20_000


def by_table_size(vocab_size, dim, budget_bytes):  # two tables when one is small, whatever the budget
    return vocab_size * dim * 4 < 3 * 2**20


def shares_the_labs_vocabulary(vocab_size, dim, budget_bytes):  # decides by the budget, except at the lab's sizes
    return vocab_size < 50_000 and 2 * vocab_size * dim * 4 <= budget_bytes


@pytest.mark.parametrize(
    "wrong, words",
    [
        (shared_table, r"word_tables\(1_000, 16, 0.19 MiB\): a training step on word 333 as a query word moved its title vector too"),
        (two_tables_when(by_vocab_size), r"word_tables\(20_000, 32, 6.00 MiB\): .*moved its title vector too.*4.88 MiB\) fits the 6.00 MiB budget"),
        (two_tables_when(by_vocab_up_to_20k), r"word_tables\(20_000, 32, 4.00 MiB\)"),
        (two_tables_when(by_table_size), r"word_tables\(20_000, 32, 4.00 MiB\): 2 tables hold 4.88 MiB, over the 4.00 MiB budget"),
        (two_tables_when(shares_the_labs_vocabulary), r"word_tables\(50_000, 64, 32.00 MiB\): .*moved its title vector too"),
    ],
)
def test_word_tables_check_lets_the_budget_decide(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_word_tables(wrong)


def halved_rows(vocab_size, dim, budget_bytes):
    return [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=vocab_size // 2, embedding_dim=dim, feature_names=[f])
        for f in ("query", "title")
    ]


def halved_dim(vocab_size, dim, budget_bytes):
    return [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=vocab_size, embedding_dim=dim // 2, feature_names=[f])
        for f in ("query", "title")
    ]


def one_feature(vocab_size, dim, budget_bytes):
    return [EmbeddingBagConfig(name="t_word", num_embeddings=vocab_size, embedding_dim=dim, feature_names=["words"])]


def query_only(vocab_size, dim, budget_bytes):
    return [EmbeddingBagConfig(name="t_word", num_embeddings=vocab_size, embedding_dim=dim, feature_names=["query"])]


def typed_in(vocab_size, dim, budget_bytes):  # the lab's numbers, whatever the arguments
    return shared_table(50_000, 64, 16 * 2**20)


def fp16_pair(vocab_size, dim, budget_bytes):
    from torchrec.types import DataType

    tables = two_tables(vocab_size, dim, budget_bytes)
    for t in tables:
        t.data_type = DataType.FP16
    return tables


def sequence_configs(vocab_size, dim, budget_bytes):
    from torchrec import EmbeddingConfig

    return [EmbeddingConfig(name="t_word", num_embeddings=vocab_size, embedding_dim=dim, feature_names=["query", "title"])]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (two_tables, r"2 tables hold 24.41 MiB, over the 16.00 MiB budget"),
        (halved_rows, r"25,000 rows for 50,000 word ids"),
        (halved_dim, r"each should get dim=64"),
        (one_feature, r"serve features \['words'\]"),
        (query_only, r"serve features \['query'\]"),
        (typed_in, r"word_tables\(30_000"),
        (fp16_pair, r"FP16"),
        (sequence_configs, r"not a list of EmbeddingBagConfig"),
        (lambda v, d, b: None, r"not a list of EmbeddingBagConfig"),
    ],
)
def test_word_tables_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_word_tables(wrong)


def kjt_sorted_keys(samples, keys):
    return kjt_key_major(samples, sorted(keys))


def kjt_one_per_sample(samples, keys):
    return [kjt_key_major([sample], keys) for sample in samples]


def kjt_wrong_stride(samples, keys):
    built = kjt_key_major(samples, keys)
    return KeyedJaggedTensor(keys=list(keys), values=built.values(), lengths=built.lengths(), stride=len(keys))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (kjt_sorted_keys, "order from the `keys` argument"),
        (kjt_one_per_sample, "return a torchrec.KeyedJaggedTensor"),
        (kjt_wrong_stride, "batch size"),
    ],
)
def test_kjt_check_rejects_more_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_kjt_from_samples(wrong)


# ------------------------------------------------------------------ more wrong answers (adversarial review)


def kjt_sorted_bags(samples, keys):  # sorts each bag's ids: a KJT keeps them in the order given
    values, lengths = [], []
    for key in keys:
        for sample in samples:
            values.extend(sorted(sample[key]))
            lengths.append(len(sample[key]))
    return KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values, dtype=torch.long),
                             lengths=torch.tensor(lengths, dtype=torch.long))


def kjt_sorts_the_samples_in_place(samples, keys):  # mutates its input (and then reads it back)
    for sample in samples:
        for key in keys:
            sample[key].sort()
    return kjt_key_major(samples, keys)


def kjt_sorts_the_keys_in_place(samples, keys):  # keys.sort(): the KJT follows the new order, and so did the check's
    keys.sort()                                   # own list, which passed (adversarial round 2)
    return kjt_key_major(samples, keys)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (kjt_sorted_bags, "in another order: keep each bag's ids in the order the sample gives them"),
        (kjt_sorts_the_samples_in_place, "changed the samples it was given"),
        (kjt_sorts_the_keys_in_place, "changed the keys it was given: ['user', 'items'] became ['items', 'user']"),
    ],
)
def test_kjt_check_rejects_answers_that_reorder_or_change_the_samples(wrong, words):
    rejects(lab02.check_kjt_from_samples, wrong, match=words)


def two_tables_of_one_name(vocab_size, dim, budget_bytes):  # an EBC refuses them: the check says so
    if 2 * vocab_size * dim * 4 <= budget_bytes:
        return [EmbeddingBagConfig(name="t_word", num_embeddings=vocab_size, embedding_dim=dim, feature_names=[f]) for f in ("query", "title")]
    return shared_table(vocab_size, dim, budget_bytes)


def test_word_tables_check_reports_tables_an_ebc_refuses():
    rejects(lab02.check_word_tables, two_tables_of_one_name, match="Duplicate table name t_word")


# ------------------------------------------------------------------ a second adversarial review


def kjt_values_without_dtype(samples, keys):  # torch.tensor([]) is float32: a batch of empty bags only gives floats
    values, lengths = [], []
    for key in keys:
        for sample in samples:
            values.extend(sample[key])
            lengths.append(len(sample[key]))
    return KeyedJaggedTensor(keys=list(keys), values=torch.tensor(values), lengths=torch.tensor(lengths))


def decides_by_a_strict_budget(vocab_size, dim, budget_bytes):  # two tables only with a byte to spare
    if 2 * vocab_size * dim * 4 < budget_bytes:
        return two_tables(vocab_size, dim, budget_bytes)
    return shared_table(vocab_size, dim, budget_bytes)


@pytest.mark.parametrize(
    "check, wrong, words",
    [
        (lab02.check_kjt_from_samples, kjt_values_without_dtype, "torch.float32"),
        (lab02.check_word_tables, decides_by_a_strict_budget, "0.12 MiB"),
    ],
)
def test_checks_reject_answers_right_only_on_the_first_cases(check, wrong, words):
    with pytest.raises(CheckFailed, match=words):
        check(wrong)


# ------------------------------------------------------------------------ exercise 2 · which columns hold a feature


def feature_columns(tables):
    columns, start = {}, 0
    for table in tables:
        for feature in table.feature_names:
            columns[feature] = slice(start, start + table.embedding_dim)
            start += table.embedding_dim
    return columns


def test_columns_check_accepts_the_solution(capsys):
    lab02.check_feature_columns(feature_columns)
    assert capsys.readouterr().out.startswith("✓")


def by_building_the_ebc(tables):  # another right answer: ask a real EBC's KeyedTensor
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    keys = [f for t in tables for f in t.feature_names]
    kjt = KeyedJaggedTensor(keys=keys, values=torch.zeros(len(keys), dtype=torch.long), lengths=torch.ones(len(keys), dtype=torch.long))
    pooled = ebc(kjt)
    starts = pooled.offset_per_key()
    return {key: slice(starts[i], starts[i + 1]) for i, key in enumerate(pooled.keys())}


def with_numpy_ends(tables):  # another right answer: NumPy integers as the slice's ends
    import numpy as np

    return {f: slice(np.int64(s.start), np.int64(s.stop)) for f, s in feature_columns(tables).items()}


@pytest.mark.parametrize("right", [by_building_the_ebc, with_numpy_ends])
def test_columns_check_accepts_other_right_answers(right, capsys):
    lab02.check_feature_columns(right)
    assert capsys.readouterr().out.startswith("✓")


def alphabetical(tables):  # the features sorted by name
    widths = sorted((f, t.embedding_dim) for t in tables for f in t.feature_names)
    columns, start = {}, 0
    for feature, dim in widths:
        columns[feature], start = slice(start, start + dim), start + dim
    return columns


def tables_by_name(tables):  # the tables sorted by name, as if the EBC kept them in a sorted dict
    return feature_columns(sorted(tables, key=lambda t: t.name))


def features_sorted_within_a_table(tables):
    return feature_columns([EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings,
                                               feature_names=sorted(t.feature_names)) for t in tables])


def one_slot_per_table(tables):  # a shared table's features all get the table's one slot
    columns, start = {}, 0
    for table in tables:
        for feature in table.feature_names:
            columns[feature] = slice(start, start + table.embedding_dim)
        start += table.embedding_dim
    return columns


def first_feature_only(tables):
    return {t.feature_names[0]: s for t, s in zip(tables, one_slot_per_table(tables).values())}


def stop_included(tables):  # the last column as the stop
    return {f: slice(s.start, s.stop - 1) for f, s in feature_columns(tables).items()}


def as_pairs(tables):
    return {f: (s.start, s.stop) for f, s in feature_columns(tables).items()}


def by_table_name(tables):  # the tables' names as keys
    return {t.name: s for t, s in zip(tables, feature_columns(tables).values())}


def equal_dims(tables):  # every feature as wide as the first table
    features = [f for t in tables for f in t.feature_names]
    d = tables[0].embedding_dim
    return {f: slice(i * d, (i + 1) * d) for i, f in enumerate(features)}


def the_labs_tables(tables):  # section 3's two tables, typed in
    return {"user": slice(0, 4), "items": slice(4, 6)}


def sorts_the_callers_tables(tables):  # right columns for the sorted list, and the caller's list is now sorted
    tables.sort(key=lambda t: t.name)
    return feature_columns(tables)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (alphabetical, "feature 'user' got columns 8:24, but .values() holds it in columns 0:16"),
        (tables_by_name, "not the names' alphabetical order"),
        (features_sorted_within_a_table, "feature 'title' got columns 4:8, but .values() holds it in columns 0:4"),
        (features_sorted_within_a_table, "within a table the order of its feature_names"),
        (one_slot_per_table, "a shared table once per feature"),
        (first_feature_only, "one slot per feature"),
        (stop_included, "a slice's stop is not included"),
        (as_pairs, "maps to (0, 16), not a slice of columns"),
        (by_table_name, "the tables' feature names, not the tables' names"),
        (equal_dims, "feature 'item' got columns 16:32"),
        (the_labs_tables, "feature_columns has entries for ['items', 'user']"),
        (sorts_the_callers_tables, "feature_columns changed its argument 1 (a list) in place"),
    ],
)
def test_columns_check_rejects_wrong_answers(wrong, words):
    rejects(lab02.check_feature_columns, wrong, match=words)


def test_column_cases_put_the_shortcuts_wrong():
    """In the check's sets of tables the alphabetical order, the tables' names and the order within a table each
    differ from the EBC's order somewhere; the KJT the check feeds comes in reverse order, and changes nothing."""
    cases = lab02._column_cases()
    real = [lab02._measured_columns(tables) for tables in cases]
    assert any(list(columns) != sorted(columns) for columns in real)
    assert any([t.name for t in tables] != sorted(t.name for t in tables) for tables in cases)
    assert any(t.feature_names != sorted(t.feature_names) for tables in cases for t in tables)
    assert all({f: (s.start, s.stop) for f, s in feature_columns(t).items()} == r for t, r in zip(cases, real))


# ----------------------------------------------------------------------- exercise 4 · fix the model, with a dot product


def pooled_width(tables):
    return sum(t.embedding_dim * len(t.feature_names) for t in tables)


def dot(pooled):
    vectors = pooled.to_dict()
    return (vectors["user_id"] * vectors["item_id"]).sum(dim=1, keepdim=True)


class Fixed(torch.nn.Module):
    def __init__(self, tables):
        super().__init__()
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
        self.linear = torch.nn.Linear(pooled_width(tables), 1)

    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(pooled.values()) + dot(pooled)


def test_model_check_accepts_the_solution(capsys):
    lab02.check_fixed_model(Fixed)
    assert capsys.readouterr().out.startswith("✓")


class PerFeature(Fixed):  # another right answer: per-feature tensors, concatenated on dim 1
    def forward(self, x):
        vectors = self.ebc(x).to_dict()
        return self.linear(torch.cat(list(vectors.values()), dim=1)) + (vectors["user_id"] * vectors["item_id"]).sum(1, keepdim=True)


class ByColumns(Fixed):  # another right answer: the user and item vectors sliced by their columns, found by name
    def forward(self, x):
        pooled = self.ebc(x)
        values, starts, keys = pooled.values(), pooled.offset_per_key(), pooled.keys()
        u, i = (keys.index(f) for f in ("user_id", "item_id"))
        user, item = values[:, starts[u]:starts[u + 1]], values[:, starts[i]:starts[i + 1]]
        return self.linear(values) + (user * item).sum(1, keepdim=True)


class WithDropout(Fixed):  # a right model with dropout before the Linear: random in training, not mixing samples
    def __init__(self, tables):
        super().__init__(tables)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(self.dropout(pooled.values())) + dot(pooled)


@pytest.mark.parametrize("right", [PerFeature, ByColumns, WithDropout])
def test_model_check_accepts_other_right_models(right, capsys):
    lab02.check_fixed_model(right)
    assert capsys.readouterr().out.startswith("✓")


class SourceExact(Fixed):  # the source text's forward, Linear(512), plus the dot product
    def __init__(self, tables):
        super().__init__(tables)
        self.linear = torch.nn.Linear(512, 1)

    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(torch.cat([emb for emb in pooled.values()], dim=1)) + dot(pooled)


class RowsIterated(Fixed):  # the variant's forward: torch.cat without dim=1 over the rows
    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(torch.cat([emb for emb in pooled.values()])) + dot(pooled)


class TypedIn512(Fixed):  # rows fixed, Linear still the seed's 512
    def __init__(self, tables):
        super().__init__(tables)
        self.linear = torch.nn.Linear(512, 1)


class TypedIn256(Fixed):  # the seed's width, typed in: right for 128 + 128 only
    def __init__(self, tables):
        super().__init__(tables)
        self.linear = torch.nn.Linear(256, 1)


class TypedIn128Slices(Fixed):  # the user and item vectors cut from .values() at a typed-in 128
    def forward(self, x):
        values = self.ebc(x).values()
        return self.linear(values) + (values[:, :128] * values[:, 128:256]).sum(1, keepdim=True)


class ByPosition(Fixed):  # the first two slots, one table's dim wide: right while user and item come first
    def forward(self, x):
        values, d = self.ebc(x).values(), self.ebc.embedding_bag_configs()[0].embedding_dim
        return self.linear(values) + (values[:, :d] * values[:, d:2 * d]).sum(1, keepdim=True)


class NoDot(Fixed):  # the seed fixed, and no more: the library's SimpleRecModel
    def forward(self, x):
        return self.linear(self.ebc(x).values())


class UserWithItself(Fixed):
    def forward(self, x):
        pooled = self.ebc(x)
        user = pooled.to_dict()["user_id"]
        return self.linear(pooled.values()) + (user * user).sum(1, keepdim=True)


class DotNotSummed(Fixed):  # the elementwise product, averaged instead of summed
    def forward(self, x):
        pooled = self.ebc(x)
        vectors = pooled.to_dict()
        return self.linear(pooled.values()) + (vectors["user_id"] * vectors["item_id"]).mean(1, keepdim=True)


class IgnoresTheTables(Fixed):  # builds the seed's tables whatever it is given
    def __init__(self, tables):
        super().__init__(lab02.SEED_TABLES())


class TakesNoTables(torch.nn.Module):  # the old exercise's signature
    def __init__(self):
        super().__init__()
        self.inner = Fixed(lab02.SEED_TABLES())

    def forward(self, x):
        return self.inner(x)


class WiderTables(Fixed):  # makes 512 fit by doubling the tables' dim
    def __init__(self, tables):
        super().__init__([EmbeddingBagConfig(name=t.name, embedding_dim=2 * t.embedding_dim, num_embeddings=t.num_embeddings,
                                             feature_names=t.feature_names) for t in tables])


class SmallerTables(Fixed):  # fewer rows: the largest ids no longer have one
    def __init__(self, tables):
        super().__init__([EmbeddingBagConfig(name=t.name, embedding_dim=t.embedding_dim, num_embeddings=t.num_embeddings // 10,
                                             feature_names=t.feature_names) for t in tables])


class OneSharedTable(Fixed):  # rows x dim per feature unchanged, but user and item ids now share rows
    def __init__(self, tables):
        user = next(t for t in tables if t.feature_names == ["user_id"])
        rest = [t for t in tables if t.feature_names not in (["user_id"], ["item_id"])]
        super().__init__(rest + [EmbeddingBagConfig(name="t_ids", embedding_dim=user.embedding_dim, num_embeddings=user.num_embeddings,
                                                    feature_names=["user_id", "item_id"])])


class OneTableToTheLinear(Fixed):  # the Linear reads the user vector only
    def __init__(self, tables):
        super().__init__(tables)
        self.linear = torch.nn.Linear(next(t.embedding_dim for t in tables if t.feature_names == ["user_id"]), 1)

    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(pooled.to_dict()["user_id"]) + dot(pooled)


class PaddedTo512(TypedIn512):  # keeps Linear(512) and pads the features with zeros
    def forward(self, x):
        pooled = self.ebc(x)
        values = pooled.values()
        return self.linear(torch.nn.functional.pad(values, (0, 512 - values.shape[1]))) + dot(pooled)


class SummedFeatures(Fixed):  # adds the user and item vectors: one table's width, both tables get gradients
    def __init__(self, tables):
        super().__init__(tables)
        self.linear = torch.nn.Linear(tables[0].embedding_dim, 1)

    def forward(self, x):
        pooled = self.ebc(x)
        vectors = pooled.to_dict()
        return self.linear(vectors["user_id"] + vectors["item_id"]) + dot(pooled)


class ReshapedTo512(TypedIn512):  # reshapes the batch to fit the Linear
    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(pooled.values().reshape(-1, 512)) + dot(pooled)


class Detached(Fixed):  # the tables never learn
    def forward(self, x):
        pooled = self.ebc(x)
        return (self.linear(pooled.values()) + dot(pooled)).detach().requires_grad_()


class Flattened(Fixed):  # one logit per sample, but [B] instead of [B, 1]
    def forward(self, x):
        return super().forward(x).squeeze(1)


class ConcatenatedOnDim0(Fixed):  # per-feature tensors on dim 0, viewed as [B, width]: rows mix samples
    def forward(self, x):
        pooled = self.ebc(x)
        return self.linear(torch.cat(list(pooled.to_dict().values()), dim=0).view(-1, self.linear.in_features)) + dot(pooled)


class AveragedOverTheBatch(Fixed):  # one vector for the whole batch, repeated
    def forward(self, x):
        pooled = self.ebc(x)
        values = pooled.values()
        return self.linear(values.mean(0, keepdim=True).expand(values.shape[0], -1)) + dot(pooled)


class LinearLeftUnused(Fixed):  # Linear defined, the output the dot product and a sum of the features
    def forward(self, x):
        pooled = self.ebc(x)
        return pooled.values().sum(1, keepdim=True) + dot(pooled)


class LinearRemoved(LinearLeftUnused):
    def __init__(self, tables):
        super().__init__(tables)
        del self.linear


SEED, ITEM_FIRST, CITY_FIRST = (case for case, _ in lab02._model_cases())


@pytest.mark.parametrize(
    "wrong, words",
    [
        (SourceExact, f"with {SEED}, a batch of 3 fails: IndexError: Dimension out of range"),
        (RowsIterated, "ROWS of the [B, 256] tensor"),
        (TypedIn512, "(3x256 and 512x1)"),
        (TypedIn256, f"with {ITEM_FIRST}, a batch of 3 fails"),
        (TypedIn128Slices, "by feature name"),
        (ByPosition, f"with {CITY_FIRST}, sample 0's logit is"),
        (NoDot, "the dot product of each sample's user and item vectors is missing"),
        (UserWithItself, f"with {SEED}, sample 0's logit is"),
        (DotNotSummed, "by feature name"),
        (IgnoresTheTables, f"with {ITEM_FIRST}, the tables changed"),
        (TakesNoTables, "take them as the argument"),
        (WiderTables, "the tables changed"),
        (SmallerTables, "the tables changed"),
        (OneSharedTable, "now share one table"),
        (OneTableToTheLinear, "no Linear takes 256 inputs"),
        (PaddedTo512, "no Linear takes 256 inputs"),
        (SummedFeatures, "no Linear takes 256 inputs"),
        (ReshapedTo512, "reshaping the batch to fit the Linear mixes samples"),
        (Detached, "does not reach table"),
        (Flattened, "output (3,), expected (3, 1)"),
        (ConcatenatedOnDim0, "the model mixes the samples of a batch"),
        (AveragedOverTheBatch, "the model mixes the samples of a batch"),
        (LinearLeftUnused, "the Linear that takes 256 inputs gets no gradient"),
        (LinearRemoved, "the model has no Linear layer"),
    ],
)
def test_model_check_rejects_wrong_answers(wrong, words):
    rejects(lab02.check_fixed_model, wrong, match=words)


class OnMeta(Fixed):  # a model built on another device than the CPU: 'meta' stands in for a GPU node's cuda:0
    seen: list[torch.device] = []

    def __init__(self, tables):
        torch.nn.Module.__init__(self)
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
        self.linear = torch.nn.Linear(pooled_width(tables), 1, device="meta")

    def forward(self, x):
        OnMeta.seen.append(x.values().device)
        raise RuntimeError("stop here: the test only reads where the batch is")


def test_model_check_feeds_batches_on_the_models_device():
    OnMeta.seen.clear()
    with pytest.raises(CheckFailed, match="stop here"):
        lab02.check_fixed_model(OnMeta)
    assert [d.type for d in OnMeta.seen] == ["meta"]


def test_a_sample_alone_stays_on_its_batchs_device():
    batch = lab02._batch_for(lab02.SEED_TABLES(), 3, device="meta")
    alone = lab02._alone(batch, 1)
    assert (batch.values().device.type, alone.values().device.type, alone.lengths().device.type) == ("meta",) * 3


def test_the_library_model_is_the_seed_fixed_without_the_dot_product():
    from course_lib.models import SimpleRecModel

    rejects(lab02.check_fixed_model, SimpleRecModel, match="dot product of each sample's user and item vectors is missing")


def test_seed_with_a_batch_of_two_is_caught_as_silently_wrong():
    class Seed(torch.nn.Module):  # the variant many copies run: Linear(512) over the rows glued into one
        def __init__(self):
            super().__init__()
            self.ebc = EmbeddingBagCollection(tables=lab02.SEED_TABLES(), device=torch.device("cpu"))
            self.linear = torch.nn.Linear(512, 1)

        def forward(self, x):
            return self.linear(torch.cat([emb for emb in self.ebc(x).values()]))

    assert Seed()(lab02.rec_batch(2)).shape == (1,)  # the silent failure the lab shows
