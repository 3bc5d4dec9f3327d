"""Checks for 11_cheaper: the bytes of a served row, a sharder with quantized comms, precisions for a budget."""
from __future__ import annotations

from typing import Any, Callable, Mapping

from course_lib import cheaper, data
from course_lib.checks import exercise, fail, one_line, passed, raise_if_unwritten

PRECISIONS = ("FP32", "FP16", "INT8", "INT4", "INT2")

# ------------------------------------------------------------------------------------------ exercise 1


def _row_bytes(dim: int, precision: str) -> int:
    """fbgemm's own answer: ``rounded_row_size_in_bytes`` with the inference kernel's defaults."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import rounded_row_size_in_bytes

    return rounded_row_size_in_bytes(dim, SparseType[precision], 16, 4)


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _diagnose_row_bytes(dim: int, precision: str, got: int) -> str:
    """What a wrong row size most likely left out."""
    bits = {"FP32": 32, "FP16": 16, "INT8": 8, "INT4": 4, "INT2": 2}[precision]
    values = dim * bits // 8
    quantized = precision.startswith("INT")
    guesses = {
        dim: f"{precision} stores {bits} bits per value, not one byte",
        dim * bits: "that is bits, not bytes",
        _round_up(values + 4, 8): "rows are padded to 16 bytes (the kernel's row_alignment), not 8",
        _round_up(values + (4 if quantized else 0), 32): "rows are padded to 16 bytes, not 32",
        _round_up(values + 8, 16): "the scale and the bias are fp16: 2 bytes each, 4 in all (not 8)",
        values + 4: "that is values + scale and bias, unpadded: the kernel pads every row to a multiple of 16 bytes",
        _round_up(values, 16): "that is the values without the 4-byte scale and bias of an integer row "
                               "(value = scale x q + bias), padded to 16 bytes",
        values: "that is the values alone: an integer row also stores a 4-byte scale and bias (2 fp16), and "
                "every row is padded to a multiple of 16 bytes",
    }
    if not quantized:
        guesses[values + 4] = f"{precision} rows carry no scale or bias: only integer rows do"
        guesses[_round_up(values + 4, 16)] = f"{precision} rows carry no scale or bias: only integer rows do"
        guesses[values] = f"{precision} rows are padded to a multiple of 16 bytes too: the kernel aligns every row"
    guesses.pop(_row_bytes(dim, precision), None)
    return guesses.get(got, "work it out as values + (scale and bias if integer), rounded up to 16 bytes")


@exercise
def check_serving_row_bytes(serving_row_bytes: Callable[[int, str], Any]) -> None:
    """`serving_row_bytes(dim, precision)`: the bytes one row of a `dim`-wide table takes in torchrec's
    quantized inference kernel, for "FP32", "FP16", "INT8", "INT4", "INT2".

    The check compares with fbgemm's own formula on widths you have not seen, and with a table quantized
    here and measured.
    """
    # 14: 56 fp32 bytes, padded to 64; 14 int8 values + 4 = 18, padded to 32 (+ 2 would still fit in 16)
    cases = [(dim, precision) for dim in (32, 14, 100, 40, 128) for precision in PRECISIONS
             if not (precision == "INT2" and dim % 4 or precision == "INT4" and dim % 2)]  # rows of whole bytes
    for dim, precision in cases:
        try:
            got = serving_row_bytes(dim, precision)
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"serving_row_bytes({dim}, {precision!r}) raised {one_line(error)}",
                 "precision is one of the strings 'FP32', 'FP16', 'INT8', 'INT4', 'INT2'")
        want = _row_bytes(dim, precision)
        if not isinstance(got, (int, float)) or got != want:
            fail(f"serving_row_bytes({dim}, {precision!r}) returned {got!r}; the kernel stores {want} bytes per row",
                 _diagnose_row_bytes(dim, precision, got) if isinstance(got, (int, float)) else "return a number of bytes")
    dim, rows = 40, 7
    model = cheaper.quantize_tables({"t": (rows, dim)}, {"t": "INT4"})
    measured = cheaper.serving_bytes(model)["t"]
    if measured != rows * serving_row_bytes(dim, "INT4"):
        fail(f"a {rows} x {dim} INT4 table measures {measured} bytes, not {rows} x {serving_row_bytes(dim, 'INT4')}")
    passed(f"serving_row_bytes agrees with fbgemm on {len(cases)} cases and with a measured {rows} x {dim} "
           f"INT4 table ({measured} bytes)")


# ------------------------------------------------------------------------------------------ exercise 2


def _precision(codec: Any) -> str:
    return str(getattr(codec, "_comm_precision", "?")).split(".")[-1].upper()


@exercise
def check_qcomm_sharder(qcomm_sharder: Callable[[str, str, float, Any], Any]) -> None:
    """`qcomm_sharder(forward, backward, learning_rate, device)`: an EmbeddingBagCollectionSharder with fused
    exact row-wise Adagrad at `learning_rate` whose pooled-embedding collectives (the all-to-all and the
    reduce-scatter) are quantized to `forward` / `backward`, with codecs built for `device`.

    The check calls it with several precisions and devices and reads the sharder's fused parameters and codecs.
    """
    import logging

    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    cases = [("FP16", "BF16", 0.05, "cpu"), ("FP16", "BF16", 0.2, None), ("BF16", "FP16", 0.1, None),
             ("FP16", "INT8", 0.3, "cpu")]  # INT8: a name the lab does not use
    for forward, backward, lr, device in cases:
        logging.disable(logging.WARNING)  # the codecs' fallback warning is expected here
        try:
            sharder = qcomm_sharder(forward, backward, lr, device)
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"qcomm_sharder{(forward, backward, lr, device)} raised {one_line(error)}",
                 "build the codecs with get_qcomm_codecs_registry(QCommsConfig(...), device=...)")
        finally:
            logging.disable(logging.NOTSET)
        call = f"qcomm_sharder({forward!r}, {backward!r}, {lr}, {device!r})"
        if type(sharder).__name__ != "EmbeddingBagCollectionSharder":
            fail(f"{call} returned a {type(sharder).__name__}", "return an EmbeddingBagCollectionSharder(...)")
        fused = sharder.fused_params or {}
        if fused.get("optimizer") != EmbOptimType.EXACT_ROWWISE_ADAGRAD:
            fail(f"{call}: the fused optimizer is {fused.get('optimizer', 'fbgemm default (exact SGD)')}",
                 "fused_params={'optimizer': EmbOptimType.EXACT_ROWWISE_ADAGRAD, 'learning_rate': learning_rate}")
        if fused.get("learning_rate") != lr:
            fail(f"{call}: the fused learning rate is {fused.get('learning_rate')}, not {lr}",
                 "pass learning_rate through to fused_params")
        registry = sharder.qcomm_codecs_registry
        if not registry:
            fail(f"{call}: the sharder has no qcomm_codecs_registry: every collective stays fp32",
                 "EmbeddingBagCollectionSharder(..., qcomm_codecs_registry=get_qcomm_codecs_registry(...))")
        for op in ("POOLED_EMBEDDINGS_ALL_TO_ALL", "POOLED_EMBEDDINGS_REDUCE_SCATTER"):
            if op not in registry:
                fail(f"{call}: no codec for {op}: "
                     + ("row-wise tables' reduce-scatter" if "REDUCE" in op else "table-wise tables' all-to-all")
                     + " stays fp32", "leave comm_ops at its default (all pooled collectives)")
        codecs = registry["POOLED_EMBEDDINGS_ALL_TO_ALL"]
        got = (_precision(codecs.forward), _precision(codecs.backward))
        fallback = lambda p: "FP16" if p == "BF16" and device == "cpu" else p  # noqa: E731
        want = (fallback(forward), fallback(backward))
        if got == (want[1], want[0]) and want[0] != want[1]:
            fail(f"{call}: forward {got[0]}, backward {got[1]}: swapped",
                 "QCommsConfig(forward_precision=..., backward_precision=...)")
        if got != want:
            hint = ("the codecs were built for another device than the one asked for: pass device on "
                    "(torch.device(device) when it is not None)" if (fallback(forward), fallback(backward)) != (forward, backward)
                    or device is None else "CommType[name] turns 'FP16' into CommType.FP16")
            fail(f"{call}: the all-to-all codecs are forward {got[0]}, backward {got[1]}; expected {want[0]}, {want[1]}",
                 hint)
    passed("qcomm_sharder: fused row-wise Adagrad at the given rate, pooled all-to-all and reduce-scatter "
           f"quantized as asked, BF16 falling back to FP16 exactly when the device is the CPU ({len(cases)} cases)")


# ------------------------------------------------------------------------------------------ exercise 3


@exercise
def check_precision_choice(
    choose_precisions: Callable[[int], Mapping[str, str]],
    model: Any,
    log: data.ClickLog,
    budgets: tuple[int, ...],
    margin: float,
) -> None:
    """`choose_precisions(budget_bytes)` returns ``{table: precision}`` for serving `model`: the check
    quantizes `model` with it for each budget, measures the tables' bytes in the kernel and the test AUC,
    and asks for bytes within the budget and an AUC within `margin` of fp32's."""
    tables = [config.name for config in log.config.tables()] if log is not None else []
    choices = {}
    for budget in budgets:  # the learner's function first: an unwritten one is reported before any work
        try:
            choices[budget] = dict(choose_precisions(budget))
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"choose_precisions({budget:,}) raised {one_line(error)}",
                 "return a dict {table name: 'FP32' | 'FP16' | 'INT8' | 'INT4' | 'INT2'}")
    _, reference = cheaper.predict(model, log.test)
    lines = []
    for budget, choice in choices.items():
        if sorted(choice) != sorted(tables):
            fail(f"choose_precisions({budget:,}) named {sorted(choice)}; the model's tables are {tables}",
                 "give every table a precision (a table left out would stay INT8, the quantizer's default)")
        unknown = {t: p for t, p in choice.items() if p not in PRECISIONS}
        if unknown:
            fail(f"choose_precisions({budget:,}): unknown precision {unknown}", f"use one of {list(PRECISIONS)}")
        served = cheaper.quantize(model, choice)
        used = sum(cheaper.serving_bytes(served).values())
        _, auc = cheaper.predict(served, log.test)
        summary = ", ".join(f"{t.removeprefix('t_')} {p}" for t, p in choice.items())
        if used > budget:
            fail(f"budget {budget:,} bytes: {summary} takes {used:,} bytes",
                 "an integer row carries a 4-byte scale and bias and is padded to 16 bytes: use your "
                 "serving_row_bytes, and the table sizes printed above")
        if reference - auc > margin:
            fail(f"budget {budget:,} bytes: {summary} fits ({used:,} bytes) but its AUC is {auc:.4f}, "
                 f"{reference - auc:.4f} below fp32's {reference:.4f} (margin {margin})",
                 "the table of one INT2 table at a time shows which tables INT2 hurts least per byte it saves")
        lines.append(f"{budget:,} B: {summary} = {used:,} B, AUC {auc:.4f} ({auc - reference:+.4f})")
    passed("within budget and margin: " + "; ".join(lines))


# ------------------------------------------------------------------------------------------ exercise 4


def _dedup_cases() -> list[tuple[str, Any, Any]]:
    """(what the case is, users, items): hand cases with users repeated across requests, then a random one."""
    import torch

    g = torch.Generator().manual_seed(11)
    return [
        ("user 3 makes two of three requests", torch.tensor([3, 3, 7]), torch.randint(0, 50, (12,), generator=g)),
        ("one request", torch.tensor([5]), torch.randint(0, 50, (6,), generator=g)),
        ("users 1 and 2 twice each, not side by side", torch.tensor([1, 2, 1, 2, 9]), torch.randint(0, 50, (10,), generator=g)),
        ("40 requests from 9 users, 5 items each", torch.randint(0, 9, (40,), generator=g), torch.randint(0, 50, (200,), generator=g)),
    ]


@exercise
def check_deduplicate(deduplicate: Callable[[Any, Any], Any]) -> None:
    """`deduplicate(users, items)` returns a variable-batch KeyedJaggedTensor (keys "user", "item") that sends
    each distinct user of the batch once and each item row once, with ``inverse_indices`` that expand it
    to the flat batch: one row per (request's user, item).

    The check builds each case's flat batch, pools both through the same unsharded EmbeddingBagCollection,
    and compares; it also counts the user ids sent.
    """
    import torch
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor

    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=f"t_{f}", embedding_dim=4, num_embeddings=50, feature_names=[f]) for f in ("user", "item")
    ])
    for what, users, items in _dedup_cases():
        flat, _ = cheaper.request_batches(users, items)
        try:
            kjt = deduplicate(users.clone(), items.clone())
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"deduplicate raised {one_line(error)} ({what})",
                 "KeyedJaggedTensor(keys=..., values=..., lengths=..., stride_per_key_per_rank=..., inverse_indices=...)")
        if not isinstance(kjt, KeyedJaggedTensor):
            fail(f"deduplicate returned a {type(kjt).__name__}, not a KeyedJaggedTensor")
        if kjt.keys() != ["user", "item"]:
            fail(f"keys {kjt.keys()}; the model's features are ['user', 'item'] in that order")
        if not kjt.variable_stride_per_key():
            fail(f"one stride for every key ({what}): that is a flat batch, every user sent once per item",
                 "stride_per_key_per_rank=[[number of users sent], [number of items]]")
        if kjt.inverse_indices_or_none() is None:
            fail("no inverse_indices: nothing says which user row each output row reads",
                 "inverse_indices=(keys, a [2, rows] tensor: the user row and the item row of each output row)")
        distinct = int(users.unique().numel())
        sent = kjt.stride_per_key()[0]
        if sent != distinct:
            hint = ("each request's user is sent once, but a user with several requests in the batch is sent several "
                    "times: deduplicate over the batch (torch.unique(users, return_inverse=True))"
                    if sent == len(users) else "send each distinct user of the batch exactly once")
            fail(f"{what}: {sent} user ids sent for {distinct} distinct users", hint)
        try:
            got, want = ebc(kjt).values(), ebc(flat).values()
        except Exception as error:
            fail(f"{what}: pooling your batch raised {one_line(error)}",
                 "lengths: one per row, all of user's rows first, then item's (key-major); one id per row here")
        if got.shape != want.shape or not torch.equal(got, want):
            fail(f"{what}: the expanded output differs from the flat batch's",
                 "inverse_indices[1][0][r] must be the position, among the users you send, of request r // items_per_request's user")
    passed(f"deduplicate sends each distinct user once and expands to the flat batch exactly ({len(_dedup_cases())} cases)")
