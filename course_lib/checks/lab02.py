"""Checks for 02_embeddings: build a KJT from samples, compute an EBC's output width, fix SimpleRecModel."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

from course_lib.checks import exercise, fail, passed

# ------------------------------------------------------------------------------------------ exercise 1


def _batches() -> list[tuple[list[dict[str, list[int]]], list[str]]]:
    """(samples, keys) pairs; the keys order differs from the samples' dict order on purpose."""
    return [
        ([{"user": [7], "items": [1, 3]}, {"user": [8], "items": [5]}, {"user": [9], "items": []}], ["user", "items"]),
        (
            [{"user": [4], "items": [2, 2, 6], "city": [1]}, {"user": [5], "items": [], "city": [0]}],
            ["items", "city", "user"],
        ),
        ([{"a": [], "b": [3]}, {"a": [1, 2], "b": []}, {"a": [0], "b": [4, 4]}, {"a": [9], "b": [8]}], ["b", "a"]),
    ]


def _per_sample(kjt: KeyedJaggedTensor) -> dict[str, list[list[int]]]:
    return {key: [ids.tolist() for ids in jt.to_dense()] for key, jt in kjt.to_dict().items()}


@exercise
def check_kjt_from_samples(kjt_from_samples: Callable[[list[dict[str, list[int]]], list[str]], Any]) -> None:
    """`kjt_from_samples(samples, keys)` must return a KJT whose bag for (key, sample b) is samples[b][key]."""
    for samples, keys in _batches():
        try:
            kjt = kjt_from_samples(samples, keys)
        except Exception as error:  # a learner's bug: report it as a check failure, not a traceback
            fail(f"kjt_from_samples(samples, keys={keys}) raised {type(error).__name__}: {error}")
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
        want = {key: [sample.get(key, []) for sample in samples] for key in keys}
        try:
            got = _per_sample(kjt)
        except Exception as error:
            fail(f"the KJT cannot be read back per sample: {type(error).__name__}: {error}",
                 "sum(lengths) must equal len(values)")
        if got != want:
            lengths = kjt.lengths().tolist()
            sample_major = [len(sample.get(key, [])) for sample in samples for key in keys]
            dict_order = [len(sample.get(key, [])) for key in samples[0] for sample in samples]
            if lengths == sample_major:
                hint = "lengths (and values) are KEY-major: all samples of the first key, then all samples of the next"
            elif lengths == dict_order:
                hint = "values and lengths follow the samples' dict order, but keys= says another order: use `keys`"
            else:
                hint = "read your KJT back with kjt[key].to_dense() and compare with the samples"
            first = next(key for key in keys if got.get(key) != want[key])
            fail(f"for keys={keys}, key {first!r} holds {got.get(first)}, expected {want[first]}", hint)
    passed("kjt_from_samples builds key-major KJTs for 3 batches (with empty bags and any key order)")


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
            got = pooled_width(tables)
        except Exception as error:
            fail(f"pooled_width raised {type(error).__name__}: {error} for [{description}]")
        want = _measured_width(tables)
        if isinstance(got, bool) or not isinstance(got, int):
            fail(f"pooled_width returned {got!r} ({type(got).__name__})", "return an int: the number of columns")
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


# ------------------------------------------------------------------------------------------ exercise 3

SEED_FEATURES = ("user_id", "item_id")


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
    """`model_class()` must map batches of 2 and 3 to [B, 1], and its loss must reach both tables."""
    torch.manual_seed(0)
    try:
        model = model_class()
    except Exception as error:
        fail(f"{getattr(model_class, '__name__', 'the model')}() raised {type(error).__name__}: {error}")
    ebcs = [m for m in model.modules() if isinstance(m, EmbeddingBagCollection)]
    if len(ebcs) != 1:
        fail(f"the model holds {len(ebcs)} EmbeddingBagCollections", "keep the seed's one `self.ebc`")
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
        except RuntimeError as error:
            message, hints = str(error), []
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
    passed("the fixed model maps batches of 3 and 2 to [B, 1], and gradients reach both tables")
