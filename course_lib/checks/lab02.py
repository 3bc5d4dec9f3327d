"""Checks for 02_embeddings: build a KJT from samples, find each feature's columns in an EBC's output, choose the word
tables, fix SimpleRecModel and give it a dot product."""
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


def _table(name: str, dim: int, features: Sequence[str], rows: int = 5) -> EmbeddingBagConfig:
    return EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows, feature_names=list(features))


def _column_cases() -> list[list[EmbeddingBagConfig]]:
    """Sets of tables the lab does not show: mixed dims, tables shared by several features, and names whose
    alphabetical order is neither the tables' order nor the order of a table's features."""
    return [
        [_table("t_user", 16, ["user"]), _table("t_item", 8, ["item"])],
        [_table("t_word", 4, ["title", "query"]), _table("t_city", 12, ["city"])],
        [_table("t_b", 8, ["b"]), _table("t_c", 24, ["e", "c", "d"]), _table("t_a", 4, ["a"])],
        [_table("t_only", 32, ["only"])],
        [_table("t_zone", 6, ["zone"]), _table("t_pair", 10, ["y", "x"]), _table("t_age", 2, ["age"]),
         _table("t_ad", 6, ["ad", "slot"])],
    ]


def _measured_columns(tables: list[EmbeddingBagConfig]) -> dict[str, tuple[int, int]]:
    """Each feature's columns (start, stop) in a real EBC's output, fed a KJT whose keys come in reverse order."""
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))
    keys = [name for t in tables for name in t.feature_names][::-1]
    kjt = KeyedJaggedTensor(keys=keys, values=torch.zeros(len(keys) * 2, dtype=torch.long),
                            lengths=torch.ones(len(keys) * 2, dtype=torch.long))
    with torch.no_grad():
        pooled = ebc(kjt)
    starts = pooled.offset_per_key()
    return {key: (starts[i], starts[i + 1]) for i, key in enumerate(pooled.keys())}


def _columns_in(order: list[tuple[str, int]]) -> dict[str, tuple[int, int]]:
    columns, start = {}, 0
    for feature, width in order:
        columns[feature] = (start, start + width)
        start += width
    return columns


@exercise
def check_feature_columns(feature_columns: Callable[[list[EmbeddingBagConfig]], Any]) -> None:
    """`feature_columns(tables)` must map each feature to the slice of columns that hold it in
    `EmbeddingBagCollection(tables)(kjt).values()`, on sets of tables the lab does not show."""
    cases = _column_cases()
    for tables in cases:
        description = ", ".join(f"{t.name}(dim {t.embedding_dim}, features {t.feature_names})" for t in tables)
        try:
            got = checked_call("feature_columns", feature_columns, tables)
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001  (the learner's code: report it)
            fail(f"feature_columns raised {type(error).__name__}: {error} for [{description}]")
        want = _measured_columns(tables)
        if not isinstance(got, dict):
            fail(f"feature_columns returned a {type(got).__name__}", "return a dict {feature name: slice(start, stop)}")
        missing, extra = [f for f in want if f not in got], [f for f in got if f not in want]
        if missing or extra:
            names = {t.name for t in tables}
            hint = ("the keys are the tables' feature names, not the tables' names" if names & set(extra) else
                    "a table listed under several feature names fills one slot per feature: every feature needs its "
                    "own entry")
            fail(f"for [{description}] feature_columns has entries for {sorted(got, key=str)}, the EBC's output has "
                 f"features {sorted(want)}", hint)
        for feature, columns in got.items():
            if not isinstance(columns, slice) or columns.step not in (None, 1) or not all(
                    isinstance(end, numbers.Integral) and not isinstance(end, bool) for end in (columns.start, columns.stop)):
                fail(f"feature {feature!r} maps to {columns!r}, not a slice of columns",
                     "give each feature a slice(start, stop) of ints: values()[:, slice] is then its pooled vector")
        given = {f: (int(s.start), int(s.stop)) for f, s in got.items()}
        if given == want:
            continue
        widths = {f: t.embedding_dim for t in tables for f in t.feature_names}
        by_name = _columns_in(sorted(widths.items()))
        by_table_name = _columns_in([(f, t.embedding_dim) for t in sorted(tables, key=lambda t: t.name) for f in t.feature_names])
        by_sorted_features = _columns_in([(f, t.embedding_dim) for t in tables for f in sorted(t.feature_names)])
        stop_included = {f: (start, stop - 1) for f, (start, stop) in want.items()}
        spans = sorted(given.values())
        if given == stop_included:
            hint = f"a slice's stop is not included: slice(0, {widths[next(iter(want))]}) holds {widths[next(iter(want))]} columns"
        elif given in (by_name, by_table_name, by_sorted_features):
            hint = ("the output follows the order of the tables as given, and within a table the order of its "
                    "feature_names; not the names' alphabetical order, nor the KJT's keys")
        elif any(b[0] < a[1] for a, b in zip(spans, spans[1:])) or any(given[f][1] - given[f][0] != widths[f] for f in want):
            hint = "each feature takes its table's embedding_dim columns, a shared table once per feature"
        else:
            hint = "build an EBC for these tables, run it on a small KJT, and print its output's .keys() and .length_per_key()"
        wrong = next(f for f in want if given[f] != want[f])
        fail(f"for [{description}] feature {wrong!r} got columns {given[wrong][0]}:{given[wrong][1]}, but .values() "
             f"holds it in columns {want[wrong][0]}:{want[wrong][1]}", hint)
    passed(f"feature_columns finds every feature's columns in a real EmbeddingBagCollection's output, on {len(cases)} "
           "sets of tables the lab does not show")


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


def _model_cases() -> list[tuple[str, list[EmbeddingBagConfig]]]:
    """The tables check_fixed_model builds the learner's model from: the seed's, then two sets the lab does not
    show (other dims, the item table first, a third feature that only the Linear reads, placed first)."""
    return [
        ("the seed's two 128-dim tables", SEED_TABLES()),
        ("two 16-dim tables, the item table first (not in the lab)",
         [_table("item_table", 16, ["item_id"], 1_000), _table("user_table", 16, ["user_id"], 1_000)]),
        ("a 4-dim city table first, then 8-dim user and item tables (not in the lab)",
         [_table("city_table", 4, ["city"], 50), _table("user_table", 8, ["user_id"], 1_000),
          _table("item_table", 8, ["item_id"], 1_000)]),
    ]


def _batch_for(
    tables: Sequence[EmbeddingBagConfig], batch_size: int, seed: int = 0, device: torch.device | str = "cpu"
) -> KeyedJaggedTensor:
    """One id per sample for every feature of `tables`, keys in the seed's order ("user_id", "item_id") then the rest,
    drawn on the CPU (the same ids on every device) and moved to `device`."""
    rows = {f: t.num_embeddings for t in tables for f in t.feature_names}
    keys = [f for f in SEED_FEATURES if f in rows] + [f for f in rows if f not in SEED_FEATURES]
    generator = torch.Generator().manual_seed(seed)
    values = torch.cat([torch.randint(0, rows[f], (batch_size,), generator=generator) for f in keys])
    batch = KeyedJaggedTensor(keys=keys, values=values, lengths=torch.ones(len(keys) * batch_size, dtype=torch.long))
    return batch.to(torch.device(device))


def _model_device(model: torch.nn.Module) -> torch.device:
    """Where the learner built the model: the device of its first parameter (a model built with the lab's `device`
    is on cuda:0 on a GPU node), the CPU for a model without parameters."""
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _alone(batch: KeyedJaggedTensor, b: int) -> KeyedJaggedTensor:
    """Sample `b` of a batch with one id per sample and feature, as a batch of 1, on the batch's device."""
    keys = list(batch.keys())
    ids = batch.values().view(len(keys), -1)
    lengths = torch.ones(len(keys), dtype=torch.long, device=ids.device)
    return KeyedJaggedTensor(keys=keys, values=ids[:, b].clone(), lengths=lengths)


@exercise
def check_fixed_model(model_class: Callable[..., torch.nn.Module]) -> None:
    """`model_class(tables)`, for the seed's tables and two sets the lab does not show, must map batches of 3 and 2
    to [B, 1]: a Linear over all of the EBC's output plus the dot product of the "user_id" and "item_id" vectors.
    Its loss must reach every table; each sample's logit must not depend on the other samples of its batch."""
    for case, tables in _model_cases():
        _check_model_on(model_class, case, tables)
    passed("FixedRecModel builds from the seed's tables and from 2 sets the lab does not show, and maps batches of 3 "
           "and 2 to [B, 1]: a Linear over all features plus the user-item dot product, gradients reaching every table")


def _check_model_on(model_class: Callable[..., torch.nn.Module], case: str, tables: list[EmbeddingBagConfig]) -> None:
    from course_lib.checks import one_line

    name = getattr(model_class, "__name__", "the model")
    torch.manual_seed(0)
    try:
        model = checked_call(name, model_class, copy.deepcopy(tables))
    except CheckFailed:
        raise
    except Exception as error:  # noqa: BLE001  (the learner's code: report it)
        hint = ("the check builds your model from tables it chooses: take them as the argument, "
                "FixedRecModel(tables)" if isinstance(error, TypeError) else "")
        fail(f"{name}(tables) with {case} raised {one_line(error)}", hint)
    ebcs = [m for m in model.modules() if isinstance(m, EmbeddingBagCollection)]
    if len(ebcs) != 1:
        fail(f"with {case}, the model holds {len(ebcs)} EmbeddingBagCollections",
             "build one `self.ebc` from the tables the model is given")

    def shapes(configs: Sequence[EmbeddingBagConfig]) -> dict[str, str]:  # by feature: what a table's name does not change
        return {f: f"{t.num_embeddings} x {t.embedding_dim}" for t in configs for f in t.feature_names}

    given, built = shapes(tables), shapes(ebcs[0].embedding_bag_configs())
    if built != given:
        fail(
            f"with {case}, the tables changed: {built} (rows x dim by feature), the tables given are {given}",
            "build the EBC from the tables the check hands your class, as they are: fix the layers after them, "
            "not the tables, to make the shapes fit",
        )
    shared = [t.feature_names for t in ebcs[0].embedding_bag_configs() if len(t.feature_names) > 1]
    if shared:
        fail(
            f"with {case}, the features {shared[0]} now share one table: a user id and an item id of the same "
            "number would look up the same row",
            "keep one table per feature, as given: user ids and item ids are different vocabularies",
        )
    ebc = ebcs[0]
    width = sum(t.embedding_dim * len(t.feature_names) for t in ebc.embedding_bag_configs())
    rows_hint = (
        f"iterating ebc(x).values() walks the ROWS of the [B, {width}] tensor and torch.cat glues the batch into one "
        "row: .values() already is the concatenation you want"
    )
    by_name = ("take the user and item vectors by feature name, .to_dict()[\"user_id\"] or their columns in .values(), "
               "not by position or by a typed-in width")
    device = _model_device(model)  # the check's batches follow the model: on a GPU node it is built on cuda:0
    for batch_size in (3, 2):
        model.zero_grad(set_to_none=True)
        try:
            out = model(_batch_for(tables, batch_size, device=device))
        except (RuntimeError, IndexError, KeyError) as error:
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
                hints.append(f"the EBC gives {width} numbers per sample here: size the Linear from the tables")
            if "must match the size of tensor" in message or isinstance(error, KeyError):
                hints.append(by_name)
            fail(f"with {case}, a batch of {batch_size} fails: {one_line(error)}",
                 "; ".join(hints) or "print the shapes that reach the Linear and the dot product")
        if not isinstance(out, torch.Tensor) or tuple(out.shape) != (batch_size, 1):
            shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
            one_row = isinstance(out, torch.Tensor) and out.numel() == 1
            hint = rows_hint if one_row else "one logit per sample: the output must be [B, 1]"
            fail(f"with {case}, a batch of {batch_size} gives output {shape}, expected ({batch_size}, 1)", hint)
        out.sum().backward()
        for table, bag in ebc.embedding_bags.items():
            grad = bag.weight.grad
            if grad is None or not bool(grad.abs().sum() > 0):
                fail(f"with {case}, the loss does not reach table {table!r}",
                     "feed the pooled vectors of ALL features to the Linear: .values() holds them all")
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    if not linears:
        fail(
            "the model has no Linear layer: the seed's Linear is what turns the pooled features into a logit",
            f"keep it and size it for the EBC's output: Linear({width}, 1) on ebc(x).values()",
        )
    linear = next((m for m in linears if m.in_features == width and m.out_features == 1), None)
    if linear is None:
        fail(
            f"with {case}, the EBC gives {width} numbers per sample, but no Linear takes {width} inputs to one output "
            f"(in_features: {[m.in_features for m in linears]})",
            f"feed ebc(x).values(), [B, {width}], to a Linear({width}, 1) sized from the tables; padding, repeating "
            "or summing the features to fit another width changes the model",
        )
    if linear.weight.grad is None or not bool(linear.weight.grad.abs().sum() > 0):
        fail(
            f"with {case}, the Linear that takes {width} inputs gets no gradient: the output does not go through it",
            f"the logit is linear(ebc(x).values()), [B, {width}] in, [B, 1] out, plus the dot product",
        )
    batch = _batch_for(tables, 3, seed=1, device=device)
    with torch.no_grad():  # rows of unit scale: the default init's are so small that a missing dot product hides
        generator = torch.Generator().manual_seed(1)
        for bag in ebc.embedding_bags.values():
            bag.weight.copy_(torch.randn(bag.weight.shape, generator=generator))
    training = model.training
    model.eval()  # layers that behave differently in training (dropout) must not read as samples mixing
    try:
        with torch.no_grad():
            together = model(batch)
            for b in range(3):
                try:
                    out = model(_alone(batch, b))
                except Exception as error:  # noqa: BLE001  (the learner's code: report it)
                    fail(f"with {case}, a batch of 1 fails: {one_line(error)}",
                         "each sample's logit must come from its own row of ebc(x).values()")
                if tuple(out.shape) != (1, 1) or not torch.allclose(out, together[b : b + 1], rtol=1e-4, atol=1e-5):
                    fail(
                        f"with {case}, sample {b} gets logit {together[b].tolist()} in a batch of 3 but "
                        f"{out.flatten().tolist()} alone: the model mixes the samples of a batch",
                        f"row b of ebc(x).values() is sample b's {width} numbers; concatenating per-feature tensors on "
                        "dim 0, stacking them, or averaging over the batch puts other samples' vectors in its row",
                    )
            pooled = ebc(batch)
            vectors = pooled.to_dict()
            linear_part = linear(pooled.values())
            dot = (vectors["user_id"] * vectors["item_id"]).sum(dim=1, keepdim=True)
            if not torch.allclose(together, linear_part + dot, rtol=1e-4, atol=1e-5):
                if torch.allclose(together, linear_part, rtol=1e-4, atol=1e-5):
                    fail(f"with {case}, the logit is the Linear's output alone: the dot product of each sample's user "
                         "and item vectors is missing", "add (user vector * item vector).sum over their columns, "
                         "one number per sample, kept as [B, 1]")
                fail(
                    f"with {case}, sample 0's logit is {together[0].item():.4f}, but the Linear over .values() plus the "
                    f"dot product of its user and item vectors gives {(linear_part + dot)[0].item():.4f}",
                    by_name,
                )
    finally:
        model.train(training)


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
