"""Checks for 02_embeddings: build a KJT from samples, compute an EBC's output width, choose the word tables, fix SimpleRecModel."""
from __future__ import annotations

import copy
import numbers
from typing import Any, Callable, Sequence

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from course_lib.checks import CheckFailed, checked_call, exercise, fail, passed

# ------------------------------------------------------------------------------------------ exercise 1


def _batches() -> list[tuple[list[dict[str, list[int]]], list[str]]]:
    """(samples, keys) pairs; the keys order differs from the samples' dict order on purpose, and some bags
    are not sorted (a KJT keeps each bag's ids in the order given)."""
    return [
        ([{"user": [7], "items": [3, 1]}, {"user": [8], "items": [5]}, {"user": [9], "items": []}], ["user", "items"]),
        (
            [{"user": [4], "items": [2, 2, 6], "city": [1]}, {"user": [5], "items": [], "city": [0]}],
            ["items", "city", "user"],
        ),
        ([{"a": [], "b": [3]}, {"a": [2, 1], "b": []}, {"a": [0], "b": [4, 4]}, {"a": [9], "b": [8]}], ["b", "a"]),
        # every bag empty: values built without a dtype come out float32 here (torch.tensor([]) is a float tensor)
        ([{"a": [], "b": []}, {"a": [], "b": []}], ["b", "a"]),
    ]


def _per_sample(kjt: KeyedJaggedTensor) -> dict[str, list[list[int]]]:
    return {key: [ids.tolist() for ids in jt.to_dense()] for key, jt in kjt.to_dict().items()}


@exercise
def check_kjt_from_samples(kjt_from_samples: Callable[[list[dict[str, list[int]]], list[str]], Any]) -> None:
    """`kjt_from_samples(samples, keys)` must return a KJT whose bag for (key, sample b) is samples[b][key]."""
    for samples, keys in _batches():
        want = {key: [list(sample.get(key, [])) for sample in samples] for key in keys}
        given = copy.deepcopy(samples)
        keys, passed_keys = list(keys), list(keys)  # the check keeps its own copy: an answer may change the one it gets
        try:  # its own guard below: it says what changed in the samples and the keys
            kjt = kjt_from_samples(samples, passed_keys)
        except Exception as error:  # a learner's bug: report it as a check failure, not a traceback
            fail(f"kjt_from_samples(samples, keys={keys}) raised {type(error).__name__}: {error}")
        if samples != given:
            fail(
                f"kjt_from_samples changed the samples it was given: {given} became {samples}",
                "read the samples without changing them (no .sort(), .pop() or += on their lists): "
                "the data loader may hand the same samples to something else",
            )
        if passed_keys != keys:  # e.g. keys.sort(): the KJT then follows the new order, and so would the caller
            fail(
                f"kjt_from_samples changed the keys it was given: {keys} became {passed_keys}",
                "read `keys` without changing it (no keys.sort() or keys.reverse()): the KJT's keys must come in "
                "the caller's order, and the caller's list must stay as it was",
            )
        if not isinstance(kjt, KeyedJaggedTensor):
            fail(f"kjt_from_samples returned a {type(kjt).__name__}", "return a torchrec.KeyedJaggedTensor")
        if list(kjt.keys()) != keys:
            hint = (
                "take the order from the `keys` argument, not from the samples' dicts"
                if sorted(kjt.keys()) == sorted(keys)
                else "every key in `keys` needs its own bags, even when they are empty"
            )
            fail(f"for keys={keys} the KJT has keys {list(kjt.keys())}", hint)
        if kjt.values().dtype not in (torch.int32, torch.int64):
            fail(
                f"values have dtype {kjt.values().dtype}",
                "ids are integers: build values with dtype=torch.long (torch.tensor([]) is a float tensor)",
            )
        if kjt.lengths().numel() != len(keys) * len(samples):
            fail(
                f"{len(samples)} samples x {len(keys)} keys need {len(keys) * len(samples)} lengths, "
                f"got {kjt.lengths().numel()}",
                "one length per (key, sample), empty bags included (length 0)",
            )
        if kjt.stride() != len(samples):
            fail(f"batch size (kjt.stride()) is {kjt.stride()}, expected {len(samples)}")
        try:
            got = _per_sample(kjt)
        except Exception as error:
            fail(f"the KJT cannot be read back per sample: {type(error).__name__}: {error}",
                 "sum(lengths) must equal len(values)")
        if got != want:
            lengths = kjt.lengths().tolist()
            sample_major = [len(sample.get(key, [])) for sample in samples for key in keys]
            dict_order = [len(sample.get(key, [])) for key in samples[0] for sample in samples]
            reordered = all(
                len(got.get(key, [])) == len(want[key]) and all(sorted(g) == sorted(w) for g, w in zip(got[key], want[key]))
                for key in keys
            )
            if reordered:
                hint = "the right ids in each bag, in another order: keep each bag's ids in the order the sample gives them"
            elif lengths == sample_major:
                hint = "lengths (and values) are KEY-major: all samples of the first key, then all samples of the next"
            elif lengths == dict_order:
                hint = "values and lengths follow the samples' dict order, but keys= says another order: use `keys`"
            else:
                hint = "read your KJT back with kjt[key].to_dense() and compare with the samples"
            first = next(key for key in keys if got.get(key) != want[key])
            fail(f"for keys={keys}, key {first!r} holds {got.get(first)}, expected {want[first]}", hint)
    passed(f"kjt_from_samples builds key-major KJTs for {len(_batches())} batches (with empty bags, a batch of empty bags "
           "only, and any key order)")


# ------------------------------------------------------------------------------------------ exercise 2


def _width_cases() -> list[list[EmbeddingBagConfig]]:
    def table(name: str, dim: int, features: Sequence[str]) -> EmbeddingBagConfig:
        return EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=5, feature_names=list(features))

    return [
        [table("t_user", 16, ["user"]), table("t_item", 8, ["item"])],
        [table("t_word", 4, ["query", "title"]), table("t_city", 12, ["city"])],
        [table("t_a", 8, ["a"]), table("t_b", 8, ["b"]), table("t_c", 24, ["c", "d", "e"])],
        [table("t_only", 32, ["only"])],
    ]


def _measured_width(tables: list[EmbeddingBagConfig]) -> int:
    """The width of a real EBC's output on a batch of 2."""
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    keys = [name for t in tables for name in t.feature_names]
    kjt = KeyedJaggedTensor(keys=keys, values=torch.zeros(len(keys) * 2, dtype=torch.long),
                            lengths=torch.ones(len(keys) * 2, dtype=torch.long))
    with torch.no_grad():
        return ebc(kjt).values().shape[1]


@exercise
def check_pooled_width(pooled_width: Callable[[list[EmbeddingBagConfig]], Any]) -> None:
    """`pooled_width(tables)` must equal the width of `EmbeddingBagCollection(tables)(kjt).values()`."""
    for tables in _width_cases():
        description = ", ".join(f"{t.name}(dim {t.embedding_dim}, features {t.feature_names})" for t in tables)
        try:
            got = checked_call("pooled_width", pooled_width, tables)
        except CheckFailed:
            raise
        except Exception as error:
            fail(f"pooled_width raised {type(error).__name__}: {error} for [{description}]")
        want = _measured_width(tables)
        if isinstance(got, bool) or not isinstance(got, numbers.Integral):  # an int, or a NumPy integer
            fail(f"pooled_width returned {got!r} ({type(got).__name__})", "return an int: the number of columns")
        got = int(got)
        if got == want:
            continue
        dims = [t.embedding_dim for t in tables]
        if got == sum(dims):
            hint = ("each FEATURE gets its own pooled vector: a table listed under several feature names "
                    "fills one slot per feature")
        elif got in dims:
            hint = ("that is one table's width. An EmbeddingCollection gives one [ids, dim] tensor per feature; an "
                    "EBC concatenates the pooled vectors of all features into one row per sample")
        elif got == sum(len(t.feature_names) for t in tables):
            hint = "you counted features; each contributes its table's embedding_dim columns"
        else:
            hint = "build the EBC, run it on a small KJT, and look at .values().shape"
        fail(f"for [{description}] pooled_width gave {got}, but the EBC's .values() is {want} wide", hint)
    passed("pooled_width matches a real EmbeddingBagCollection's output width on 4 sets of tables")


# ----------------------------------------------------------------------------------------- exercise 4 · fix the model

SEED_FEATURES = ("user_id", "item_id")


def SEED_TABLES() -> list[EmbeddingBagConfig]:  # noqa: N802  (a constant, built fresh each time)
    """The two tables of the tutorials' SimpleRecModel, which the fixed model must keep."""
    return [
        EmbeddingBagConfig(name="user_table", embedding_dim=128, num_embeddings=10_000, feature_names=["user_id"]),
        EmbeddingBagConfig(name="item_table", embedding_dim=128, num_embeddings=10_000, feature_names=["item_id"]),
    ]


def rec_batch(batch_size: int, seed: int = 0, num_embeddings: int = 10_000) -> KeyedJaggedTensor:
    """A batch for the tutorials' SimpleRecModel: one id per sample for "user_id" and for "item_id"."""
    generator = torch.Generator().manual_seed(seed)
    n = len(SEED_FEATURES) * batch_size
    return KeyedJaggedTensor(
        keys=list(SEED_FEATURES),
        values=torch.randint(0, num_embeddings, (n,), generator=generator),
        lengths=torch.ones(n, dtype=torch.long),
    )


@exercise
def check_fixed_model(model_class: Callable[[], torch.nn.Module]) -> None:
    """`model_class()` must map batches of 2 and 3 to [B, 1], and its loss must reach both tables through a
    Linear sized for the EBC's output; each sample's logit must not depend on the other samples of its batch."""
    from course_lib.checks import one_line

    torch.manual_seed(0)
    try:
        model = model_class()
    except Exception as error:
        fail(f"{getattr(model_class, '__name__', 'the model')}() raised {type(error).__name__}: {error}")
    ebcs = [m for m in model.modules() if isinstance(m, EmbeddingBagCollection)]
    if len(ebcs) != 1:
        fail(f"the model holds {len(ebcs)} EmbeddingBagCollections", "keep the seed's one `self.ebc`")
    def shapes(configs: Sequence[EmbeddingBagConfig]) -> dict[str, str]:  # by feature: what a table's name does not change
        return {f: f"{t.num_embeddings} x {t.embedding_dim}" for t in configs for f in t.feature_names}

    given, built = shapes(SEED_TABLES()), shapes(ebcs[0].embedding_bag_configs())
    if built != given:
        fail(
            f"the tables changed: {built} (rows x dim by feature), the seed's are {given}",
            "keep the tables as given: fix the layers after them, not the tables, to make the shapes fit",
        )
    shared = [t.feature_names for t in ebcs[0].embedding_bag_configs() if len(t.feature_names) > 1]
    if shared:
        fail(
            f"the features {shared[0]} now share one table: user {SEED_TABLES()[0].num_embeddings - 1} and item "
            f"{SEED_TABLES()[0].num_embeddings - 1} would look up the same row",
            "keep the seed's two tables, one per feature: user ids and item ids are different vocabularies",
        )
    tables = ebcs[0].embedding_bags
    width = sum(t.embedding_dim * len(t.feature_names) for t in ebcs[0].embedding_bag_configs())
    rows_hint = (
        f"iterating ebc(x).values() walks the ROWS of the [B, {width}] tensor and torch.cat glues the batch into one "
        "row: .values() already is the concatenation you want"
    )
    for batch_size in (3, 2):
        model.zero_grad(set_to_none=True)
        try:
            out = model(rec_batch(batch_size))
        except (RuntimeError, IndexError) as error:
            message, hints = str(error), []
            if "is invalid for input of size" in message:
                hints.append(
                    f"reshaping the batch to fit the Linear mixes samples into one row: the EBC gives {width} "
                    f"numbers per sample, so the Linear must take {width}"
                )
            if "Dimension out of range" in message:
                hints.append(
                    "iterating ebc(x).values() yields 1-D rows (one per sample), which have no dim 1: "
                    ".values() already is the [B, sum of dims] concatenation; .to_dict() gives per-feature tensors"
                )
            if f"1x{batch_size * width}" in message:
                hints.append(rows_hint)
            if "cannot be multiplied" in message and not message.rsplit(" and ", 1)[-1].startswith(f"{width}x"):
                hints.append(f"the EBC gives {width} numbers per sample: size the Linear from the configs")
            fail(f"a batch of {batch_size} fails: {message}", "; ".join(hints) or "print the shape that reaches the Linear")
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch_size, 1):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            one_row = isinstance(out, torch.Tensor) and out.numel() == 1
            hint = rows_hint if one_row else "one logit per sample: the output must be [B, 1]"
            fail(f"a batch of {batch_size} gives output {shape}, expected ({batch_size}, 1)", hint)
        out.sum().backward()
        for name, bag in tables.items():
            grad = bag.weight.grad
            if grad is None or not bool(grad.abs().sum() > 0):
                fail(f"the loss does not reach table {name!r}",
                     "feed the pooled vectors of BOTH features to the Linear: .values() holds them all")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        fail(
            "the model has no Linear layer: the seed's Linear is what turns the pooled features into a logit",
            f"keep it and size it for the EBC's output: Linear({width}, 1) on ebc(x).values()",
        )
    if not any(m.in_features == width for m in linears):
        fail(
            f"the EBC gives {width} numbers per sample, but no Linear takes {width} inputs "
            f"(in_features: {[m.in_features for m in linears]})",
            f"feed ebc(x).values(), [B, {width}], to a Linear({width}, ...); padding, repeating or summing the "
            "features to fit another width changes the model",
        )
    if not any(m.in_features == width and m.weight.grad is not None and bool(m.weight.grad.abs().sum() > 0) for m in linears):
        fail(
            f"the Linear that takes {width} inputs gets no gradient: the output does not go through it",
            f"forward must return linear(ebc(x).values()): [B, {width}] in, [B, 1] out",
        )
    batch = rec_batch(3)
    training = model.training
    model.eval()  # layers that behave differently in training (dropout) must not read as samples mixing
    try:
        with torch.no_grad():
            together = model(batch)
            ids = batch.values().view(len(SEED_FEATURES), 3)
            for b in range(3):
                alone = KeyedJaggedTensor(keys=list(SEED_FEATURES), values=ids[:, b].clone(), lengths=torch.ones(len(SEED_FEATURES), dtype=torch.long))
                try:
                    out = model(alone)
                except Exception as error:  # noqa: BLE001  (the learner's code: report it)
                    fail(f"a batch of 1 fails: {one_line(error)}", "each sample's logit must come from its own row of ebc(x).values()")
                if tuple(out.shape) != (1, 1) or not torch.allclose(out, together[b : b + 1], rtol=1e-4, atol=1e-5):
                    fail(
                        f"sample {b} gets logit {together[b].tolist()} in a batch of 3 but {out.flatten().tolist()} alone: "
                        "the model mixes the samples of a batch",
                        f"row b of ebc(x).values() is sample b's {width} numbers; concatenating per-feature tensors on dim 0, "
                        "stacking them, or averaging over the batch before the Linear puts other samples' vectors in its row",
                    )
    finally:
        model.train(training)
    passed("the fixed model maps batches of 3 and 2 to [B, 1], and gradients reach both tables")


# ------------------------------------------------------------------------------------------- exercise 3 · word tables

WORD_FEATURES = ("query", "title")
# (vocab_size, dim, budget_bytes): the lab's case first, then fresh ones; in the last, two tables fit too.
# the budget decides, not the size: the same 20,000 x 32 tables must share under 4 MiB and split under 6 MiB, and the
# lab's 50,000 x 64 tables must split under 32 MiB (a rule on the vocabulary or the table size alone fails one of them)
WORD_CASES = [(50_000, 64, 16 * 2**20), (30_000, 32, 4 * 2**20), (1_000, 16, 200_000), (20_000, 32, 6 * 2**20),
              (20_000, 32, 4 * 2**20), (50_000, 64, 32 * 2**20),
              (1_000, 16, 128_000)]  # two tables fill the budget exactly: they fit (a strict < shares one)


def _mib(n: float) -> str:
    return f"{n / 2**20:.2f} MiB"


@exercise
def check_word_tables(word_tables: Callable[..., Any]) -> None:
    """`word_tables(vocab_size, dim, budget_bytes)` gives EBC tables for the features "query" and "title"
    (ids of one vocabulary) such that every id has its own row, each feature gets its own `dim`-wide slot in
    the output, and the fp32 parameters fit `budget_bytes`; and, whenever the budget has room for a table per
    feature, a training step on a word's query use leaves its title vector alone (each feature keeps its own
    meaning). Checked on the lab's sizes and on fresh ones, some with room for a table per feature."""
    from torchrec.types import DataType

    from course_lib.checks import one_line

    for vocab_size, dim, budget in WORD_CASES:
        case = f"word_tables({vocab_size:_}, {dim}, {_mib(budget)})"
        try:
            tables = checked_call("word_tables", word_tables, vocab_size, dim, budget)
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (the learner's code: report it)
            fail(f"{case} raised {one_line(error)}")
        if isinstance(tables, EmbeddingBagConfig):
            tables = [tables]
        if not isinstance(tables, (list, tuple)) or not all(isinstance(t, EmbeddingBagConfig) for t in tables):
            kinds = sorted({type(t).__name__ for t in tables}) if isinstance(tables, (list, tuple)) else [type(tables).__name__]
            fail(
                f"{case} returned {', '.join(kinds)}, not a list of EmbeddingBagConfig",
                "pooled bags of words need EmbeddingBagConfig (EmbeddingConfig is for one vector per id)",
            )
        features = [f for t in tables for f in t.feature_names]
        if sorted(features) != sorted(WORD_FEATURES):
            fail(
                f"{case}: the tables serve features {features}, not {list(WORD_FEATURES)}",
                "each feature is named in exactly one table's feature_names; one table may list both, and each "
                "feature is still pooled on its own",
            )
        for t in tables:
            if t.data_type != DataType.FP32:
                fail(f"{case}: table {t.name!r} is {t.data_type.name}", "keep the tables in fp32 here (lab 11 measures fp16 tables)")
        short = [t for t in tables if t.num_embeddings < vocab_size]
        if short:
            t = short[0]
            fail(
                f"{case}: table {t.name!r} has {t.num_embeddings:,} rows for {vocab_size:,} word ids",
                f"ids from {t.num_embeddings:,} up have no row (an EBC fails on them, a hash would make words "
                "collide): every word needs its own row",
            )
        total = sum(t.num_embeddings * t.embedding_dim * 4 for t in tables)
        width = sum(t.embedding_dim * len(t.feature_names) for t in tables)
        per_feature = {f: t.embedding_dim for t in tables for f in t.feature_names}
        if any(d != dim for d in per_feature.values()):
            fail(
                f"{case}: the features get {per_feature} columns, each should get dim={dim}",
                "keep the width you are given: the dense layers after the EBC expect it",
            )
        if total > budget:
            fail(
                f"{case}: {len(tables)} tables hold {_mib(total)}, over the {_mib(budget)} budget",
                "query and title words come from one vocabulary: one table can serve both features "
                "(feature_names=['query', 'title']), and each feature still gets its own pooled slot",
            )
        try:
            ebc = EmbeddingBagCollection(tables=list(tables), device=torch.device("cpu"))
        except Exception as error:  # noqa: BLE001  (tables an EBC refuses, e.g. two of one name)
            fail(f"{case}: an EmbeddingBagCollection of these tables raises {one_line(error)}", "give each table its own name")
        ids = torch.tensor([0, vocab_size - 1, vocab_size // 2, vocab_size - 1])
        kjt = KeyedJaggedTensor(keys=list(WORD_FEATURES), values=ids, lengths=torch.tensor([1, 1, 1, 1]))
        with torch.no_grad():
            out = ebc(kjt)
        if out.values().shape != (2, 2 * dim) or width != 2 * dim:
            fail(f"{case}: the EBC's output is {tuple(out.values().shape)}, expected (2, {2 * dim})")
        separate = 2 * vocab_size * dim * 4
        if separate <= budget:  # room for a table per feature: the query's training must not move the title's word
            word = vocab_size // 3
            one_word = KeyedJaggedTensor(keys=list(WORD_FEATURES), values=torch.tensor([word, word]),
                                         lengths=torch.tensor([1, 1]))
            title_before = ebc(one_word).to_dict()["title"].detach().clone()
            ebc(one_word).to_dict()["query"].sum().backward()  # a step on the word's query use only
            with torch.no_grad():
                for p in ebc.parameters():
                    if p.grad is not None:
                        p -= 0.5 * p.grad
            with torch.no_grad():
                title_after = ebc(one_word).to_dict()["title"]
            if not torch.equal(title_before, title_after):
                fail(
                    f"{case}: a training step on word {word} as a query word moved its title vector too "
                    "(query and title share one meaning for every word), though a table per feature "
                    f"({_mib(separate)}) fits the {_mib(budget)} budget",
                    "the words mean different things in a query and in a title: when the budget has room, give "
                    "each feature a table of its own; share one only when two do not fit",
                )
    passed(
        "word_tables gives every word its own row, each feature its own slot, within the budget, and each feature "
        f"its own meaning wherever the budget has room, in {len(WORD_CASES)} cases of vocabulary and budget"
    )
