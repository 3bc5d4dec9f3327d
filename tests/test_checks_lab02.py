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


class SourceExact(Seed):  # the source text's forward: torch.cat(..., dim=1) over the rows
    def forward(self, x):
        return self.linear(torch.cat([emb for emb in self.ebc(x).values()], dim=1))


class WiderTables(Fixed):  # makes 512 fit by doubling the tables' dim
    def __init__(self):
        super().__init__()
        tables = [EmbeddingBagConfig(name=t.name, embedding_dim=256, num_embeddings=10_000, feature_names=t.feature_names) for t in _tables()]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
        self.linear = torch.nn.Linear(512, 1)


class SmallerTables(Fixed):  # fewer rows: ids up to 9,999 no longer have one
    def __init__(self):
        super().__init__()
        tables = [EmbeddingBagConfig(name=t.name, embedding_dim=128, num_embeddings=1_000, feature_names=t.feature_names) for t in _tables()]
        self.ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


class PaddedTo512(Seed):  # keeps Linear(512) and pads the features with zeros
    def forward(self, x):
        return self.linear(torch.nn.functional.pad(self.ebc(x).values(), (0, 256)))


class RepeatedTo512(Seed):  # keeps Linear(512) and feeds the features twice
    def forward(self, x):
        values = self.ebc(x).values()
        return self.linear(torch.cat([values, values], dim=1))


class SummedFeatures(Fixed):  # adds user and item vectors: 128 wide, both tables get gradients
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(128, 1)

    def forward(self, x):
        return self.linear(sum(self.ebc(x).to_dict().values()))


class ReshapedTo512(Seed):  # reshapes the batch to fit the Linear
    def forward(self, x):
        return self.linear(self.ebc(x).values().reshape(-1, 512))


class Detached(Fixed):  # the tables never learn
    def forward(self, x):
        return self.linear(self.ebc(x).values().detach())


class PerFeature(Fixed):  # the other right answer: per-feature tensors, concatenated on dim 1
    def forward(self, x):
        return self.linear(torch.cat(list(self.ebc(x).to_dict().values()), dim=1))


def test_model_check_accepts_per_feature_concatenation(capsys):
    lab02.check_fixed_model(PerFeature)
    assert capsys.readouterr().out.startswith("✓")


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
        (SourceExact, r"(?s)Dimension out of range.*1-D rows"),
        (WiderTables, r"tables changed"),
        (SmallerTables, r"tables changed"),
        (PaddedTo512, r"no Linear takes 256 inputs"),
        (RepeatedTo512, r"no Linear takes 256 inputs"),
        (SummedFeatures, r"no Linear takes 256 inputs"),
        (ReshapedTo512, r"reshaping the batch to fit the Linear mixes samples"),
        (Detached, r"does not reach table"),
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


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda tables: len(tables) * tables[0].embedding_dim, "pooled_width gave 32, but the EBC's .values\\(\\) is 24 wide"),
        (lambda tables: sum(t.embedding_dim for t in tables) * max(len(t.feature_names) for t in tables), "is 20 wide"),
    ],
)
def test_width_check_rejects_more_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab02.check_pooled_width(wrong)


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


class ConcatenatedOnDim0(Fixed):  # [2B, 128] viewed as [B, 256]: a row holds two users, or two items
    def forward(self, x):
        return self.linear(torch.cat(list(self.ebc(x).to_dict().values()), dim=0).view(-1, 256))


class StackedAndReshaped(Fixed):  # [2, B, 128] reshaped to [B, 256]: the same mix
    def forward(self, x):
        pooled = self.ebc(x).to_dict()
        return self.linear(torch.stack([pooled["user_id"], pooled["item_id"]]).reshape(-1, 256))


class AveragedOverTheBatch(Fixed):  # one vector for the whole batch, repeated: every sample gets one logit
    def forward(self, x):
        values = self.ebc(x).values()
        return self.linear(values.mean(0, keepdim=True).expand(values.shape[0], -1))


class LinearLeftUnused(Fixed):  # Linear(256, 1) defined, the output a sum of the features
    def forward(self, x):
        return self.ebc(x).values().sum(1, keepdim=True)


class LinearRemoved(Fixed):
    def __init__(self):
        super().__init__()
        del self.linear

    def forward(self, x):
        return self.ebc(x).values().sum(1, keepdim=True)


class OneSharedTable(Fixed):  # rows x dim per feature unchanged, but user and item ids now share rows
    def __init__(self):
        super().__init__()
        table = EmbeddingBagConfig(name="t_ids", embedding_dim=128, num_embeddings=10_000, feature_names=["user_id", "item_id"])
        self.ebc = EmbeddingBagCollection(tables=[table], device=torch.device("cpu"))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (ConcatenatedOnDim0, "the model mixes the samples of a batch"),
        (StackedAndReshaped, "the model mixes the samples of a batch"),
        (AveragedOverTheBatch, "the model mixes the samples of a batch"),
        (LinearLeftUnused, "the Linear that takes 256 inputs gets no gradient"),
        (LinearRemoved, "the model has no Linear layer"),
        (OneSharedTable, "now share one table"),
    ],
)
def test_model_check_rejects_answers_that_fit_the_shapes_but_change_the_model(wrong, words):
    rejects(lab02.check_fixed_model, wrong, match=words)


def two_tables_of_one_name(vocab_size, dim, budget_bytes):  # an EBC refuses them: the check says so
    if 2 * vocab_size * dim * 4 <= budget_bytes:
        return [EmbeddingBagConfig(name="t_word", num_embeddings=vocab_size, embedding_dim=dim, feature_names=[f]) for f in ("query", "title")]
    return shared_table(vocab_size, dim, budget_bytes)


def test_word_tables_check_reports_tables_an_ebc_refuses():
    rejects(lab02.check_word_tables, two_tables_of_one_name, match="Duplicate table name t_word")


def test_pooled_width_that_sorts_the_callers_tables_is_rejected():
    def sorting_in_place(tables):  # the right width, but the caller's list is now in another order
        tables.sort(key=lambda t: -t.embedding_dim)
        return sum(t.embedding_dim * len(t.feature_names) for t in tables)

    with pytest.raises(CheckFailed, match=r"pooled_width changed its argument 1 \(a list\) in place"):
        lab02.check_pooled_width(sorting_in_place)


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


def test_width_check_accepts_a_numpy_integer(capsys):
    import numpy as np

    lab02.check_pooled_width(lambda tables: np.sum([t.embedding_dim * len(t.feature_names) for t in tables]))
    assert capsys.readouterr().out.startswith("✓")


class WithDropout(Fixed):  # a right model with dropout before the Linear: random in training, not mixing samples
    def __init__(self):
        super().__init__()
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        return self.linear(self.dropout(self.ebc(x).values()))


def test_model_check_accepts_dropout(capsys):  # was: "the model mixes the samples of a batch"
    lab02.check_fixed_model(WithDropout)
    assert capsys.readouterr().out.startswith("✓")
