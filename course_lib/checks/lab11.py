"""Checks for 11_cheaper: a sharder with quantized comms, deduplicated requests, the bytes of a served row, precisions
for a memory budget (exercises 1 to 4, in the lab's order)."""
from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping

from course_lib import cheaper
from course_lib.checks import CheckFailed, checked_call, exercise, fail, is_number, one_line, passed, raise_if_unwritten

PRECISIONS = ("FP32", "FP16", "INT8", "INT4", "INT2")

# ------------------------------------------------------------------------------------------ exercise 1


def _precision(codec: Any) -> str:
    return str(getattr(codec, "_comm_precision", "?")).split(".")[-1].upper()


@exercise
def check_qcomm_sharder(qcomm_sharder: Callable[[str, str, float, Any], Any]) -> None:
    """`qcomm_sharder(forward, backward, learning_rate, device)`: an EmbeddingBagCollectionSharder with fused
    exact row-wise Adagrad at `learning_rate` whose pooled-embedding collectives (the all-to-all and the
    reduce-scatter) are quantized to `forward` / `backward`, with codecs built for `device`.

    The check calls it with several precisions and devices and reads the sharder's fused parameters and the
    forward and backward precision of both collectives' codecs.
    """
    import logging

    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    cases = [("FP16", "BF16", 0.05, "cpu"), ("FP16", "BF16", 0.2, "cuda"), ("FP16", "INT8", 0.3, "cpu"),
             ("BF16", "FP16", 0.1, None),
             ("FP32", "FP16", 0.02, "cpu")]  # INT8 and FP32: names the lab does not use; rates other than its 0.1
    # "cuda": a device the lab's CPU runs never pass; BF16 stays BF16 there (building the codecs needs no GPU)
    for forward, backward, lr, device in cases:
        logging.disable(logging.WARNING)  # the codecs' fallback warning is expected here
        try:
            sharder = checked_call("qcomm_sharder", qcomm_sharder, forward, backward, lr, device)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            string_device = isinstance(error, AttributeError) and "'str' object has no attribute" in str(error)
            fail(f"qcomm_sharder{(forward, backward, lr, device)} raised {one_line(error)}",
                 "device arrives as a string ('cpu') and the registry reads device.type: pass "
                 "torch.device(device) (and None as None)" if string_device else
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
        fallback = lambda p: "FP16" if p == "BF16" and device == "cpu" else p  # noqa: E731
        want = (fallback(forward), fallback(backward))
        lab_pair = (fallback("FP16"), fallback("BF16"))
        for op, collective in (("POOLED_EMBEDDINGS_ALL_TO_ALL", "all-to-all"),
                               ("POOLED_EMBEDDINGS_REDUCE_SCATTER", "reduce-scatter")):
            codecs = registry[op]
            got = (_precision(codecs.forward), _precision(codecs.backward))
            if got == (want[1], want[0]) and want[0] != want[1]:
                fail(f"{call}: the {collective} codecs are forward {got[0]}, backward {got[1]}: swapped",
                     "QCommsConfig(forward_precision=..., backward_precision=...)")
            if got == lab_pair and want != lab_pair:
                fail(f"{call}: the {collective} codecs are forward {got[0]}, backward {got[1]}, the lab's pair; "
                     f"expected {want[0]}, {want[1]}", "build QCommsConfig from the forward and backward arguments")
            if got != want:
                on_cpu = tuple("FP16" if p == "BF16" else p for p in (forward, backward))
                hint = (f"the codecs were built for another device than the one asked for ({device!r}): BF16 came back "
                        "as FP16, which they do only for the CPU; build them for torch.device(device), whatever the "
                        "device (and None as None)"
                        if device not in ("cpu", None) and got == on_cpu != want else
                        "the codecs were built for another device than the one asked for: pass device on "
                        "(torch.device(device) when it is not None)"
                        if (fallback(forward), fallback(backward)) != (forward, backward) or device is None
                        else "CommType[name] turns 'FP16' into CommType.FP16")
                fail(f"{call}: the {collective} codecs are forward {got[0]}, backward {got[1]}; expected "
                     f"{want[0]}, {want[1]}", hint)
    passed("qcomm_sharder: fused row-wise Adagrad at the given rate, pooled all-to-all and reduce-scatter "
           f"quantized as asked, BF16 falling back to FP16 exactly when the device is the CPU ({len(cases)} cases)")


# ------------------------------------------------------------------------------------------ exercise 2


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
            kjt = checked_call("deduplicate", deduplicate, users, items)
        except CheckFailed:
            raise
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


# ------------------------------------------------------------------------------------------ exercise 3

BITS = {"FP32": 32, "FP16": 16, "INT8": 8, "INT4": 4, "INT2": 2}

# (dim, precision) the check measures: widths the lab does not show, odd ones for the float types; an integer
# row's values must fill whole 2-byte units, or the quantizer refuses the table, so INT8 takes even widths,
# INT4 multiples of 4 and INT2 multiples of 8
ROW_CASES = [(13, "FP32"), (3, "FP32"), (40, "FP32"), (13, "FP16"), (7, "FP16"), (100, "FP16"),
             (14, "INT8"), (6, "INT8"), (100, "INT8"), (36, "INT4"), (100, "INT4"), (12, "INT4"),
             (40, "INT2"), (24, "INT2"), (8, "INT2"), (56, "INT2")]
# 16: the unsharded QuantEmbeddingBagCollection's default; 1: the sharded kernels on a CPU; 8 and 32: others
ALIGNMENTS = (16, 1, 8, 32)


def _row_bytes(dim: int, precision: str, row_alignment: int = 16) -> int:
    """fbgemm's own formula: ``rounded_row_size_in_bytes`` with a 4-byte scale and bias."""
    from fbgemm_gpu.split_embedding_configs import SparseType
    from fbgemm_gpu.split_table_batched_embeddings_ops_inference import rounded_row_size_in_bytes

    return rounded_row_size_in_bytes(dim, SparseType[precision], row_alignment, 4)


def measured_row_bytes(cases: list[tuple[int, str]], row_alignment: int, rows: int = 3) -> dict[tuple[int, str], int]:
    """Bytes per row of a `rows`-row table for each ``(dim, precision)`` of `cases`, measured off the kernel of
    an unsharded model quantized by ``cheaper.quantize`` (``quantize_inference_model``) with its rows aligned to
    `row_alignment` bytes (``quant_prep_customize_row_alignment``)."""
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig
    from torchrec.quant.embedding_modules import quant_prep_customize_row_alignment

    names = {f"t_{i}": case for i, case in enumerate(cases)}
    ebc = EmbeddingBagCollection(tables=[
        EmbeddingBagConfig(name=name, embedding_dim=dim, num_embeddings=rows, feature_names=[name])
        for name, (dim, _) in names.items()
    ])
    model = nn.Sequential(ebc)
    quant_prep_customize_row_alignment(model, [EmbeddingBagCollection], row_alignment)
    sizes = cheaper.serving_bytes(cheaper.quantize(model, {name: p for name, (_, p) in names.items()}))
    return {case: sizes[name] // rows for name, case in names.items()}


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _diagnose_row_bytes(dim: int, precision: str, alignment: int, got: int) -> str:
    """What a wrong row size most likely left out (a later guess wins where two give the same number)."""
    bits = BITS[precision]
    values = dim * bits // 8
    quantized = precision.startswith("INT")
    qparams = 4 if quantized else 0
    guesses: dict[int, str] = {}
    if quantized:  # the rarer mistakes first: where two give the same number, the commoner one's message wins
        guesses[_round_up(values + 2, alignment)] = "an integer row holds a scale AND a bias, 2 bytes each"
        guesses[_round_up(values + 8, alignment)] = "the scale and the bias are fp16: 2 bytes each, 4 in all (not 8)"
        guesses[dim] = f"{precision} stores {bits} bits per value, not one byte"
        guesses[_round_up(dim + qparams, alignment)] = f"{precision} packs {8 // bits} values per byte, not one"
    guesses.update({
        dim * bits: "that is bits, not bytes",
        values: "that is the values alone: an integer row also stores an fp16 scale and bias, and every row is padded "
                "to a multiple of row_alignment",
        _round_up(values, alignment): "that leaves out (some of) the 4 bytes an integer row stores before its values: "
                                      "an fp16 scale and an fp16 bias (value = scale x q + bias)",
        values + qparams: f"that is the row unpadded: rows are padded to a multiple of row_alignment ({alignment} bytes)",
    })
    if not quantized:
        guesses[values + 4] = f"{precision} rows carry no scale or bias: only integer rows do"
        guesses[_round_up(values + 4, alignment)] = f"{precision} rows carry no scale or bias: only integer rows do"
        if values % alignment:
            guesses[values] = f"{precision} rows are padded to a multiple of row_alignment ({alignment} bytes) too"
    if alignment != 16:
        guesses[_round_up(values + qparams, 16)] = (
            f"that is the row padded to 16 bytes: here row_alignment is {alignment}, and the padding is the "
            "argument's, not always the unsharded module's 16")
    guesses.pop(_row_bytes(dim, precision, alignment), None)
    return guesses.get(got, "work it out from what a row holds (scale and bias for an integer type, then the "
                            "values), rounded up to a multiple of row_alignment")


@exercise
def check_serving_row_bytes(serving_row_bytes: Callable[[int, str, int], Any]) -> None:
    """`serving_row_bytes(dim, precision, row_alignment)`: the bytes one row of a `dim`-wide table takes in
    fbgemm's quantized inference kernel, for "FP32", "FP16", "INT8", "INT4", "INT2", with rows aligned to
    `row_alignment` bytes.

    The check calls it on widths, and alignments, the lab does not show, and compares each answer, an int (a
    NumPy integer too), with the bytes per row measured off a table quantized here (``measured_row_bytes``).
    """
    measured = {alignment: measured_row_bytes(ROW_CASES, alignment) for alignment in ALIGNMENTS}
    for alignment in ALIGNMENTS:
        for dim, precision in ROW_CASES:
            call = f"serving_row_bytes({dim}, {precision!r}, {alignment})"
            try:
                got = checked_call("serving_row_bytes", serving_row_bytes, dim, precision, alignment)
            except CheckFailed:
                raise
            except Exception as error:
                raise_if_unwritten(error)
                fail(f"{call} raised {one_line(error)}",
                     "precision is one of the strings 'FP32', 'FP16', 'INT8', 'INT4', 'INT2'; row_alignment a number of bytes")
            want = measured[alignment][(dim, precision)]
            if isinstance(got, bool) or not isinstance(got, numbers.Integral):  # a NumPy integer is an int too
                if is_number(got) and got == want:
                    fail(f"{call} returned {got!r}, a {type(got).__name__}: a number of bytes is an int",
                         "round up with integers: -(-n // k) * k, or math.ceil(n / k) * k")
                fail(f"{call} returned {got!r}; a {dim}-wide {precision} table measures {want} bytes per row",
                     "return a number of bytes (an int)")
            got = int(got)
            if got != want:
                fail(f"{call} returned {got}; a {dim}-wide {precision} table quantized with row_alignment={alignment} "
                     f"measures {want} bytes per row",
                     _diagnose_row_bytes(dim, precision, alignment, got))
    passed(f"serving_row_bytes matches the bytes per row measured on {len(ROW_CASES)} tables of widths from "
           f"{min(d for d, _ in ROW_CASES)} to {max(d for d, _ in ROW_CASES)}, at row alignments "
           + ", ".join(map(str, ALIGNMENTS)))


# ------------------------------------------------------------------------------------------ exercise 4

# Table sets the lab does not show, each with its own quality costs (AUC lost with the table alone at a
# precision). In the first, the largest table (t_doc) is the one INT2 hurts most, and at 16 wide an INT2 row
# takes the bytes of an INT4 one; in the second, widths from 8 to 56, where the largest table takes INT2 best.
# Neither "INT2 on the largest table" nor "INT2 wherever it fits" is the answer there. In the third, the least
# total cost is neither the least worst-table cost, nor the fewest tables with a cost, nor what a greedy climb
# from all-INT2 (the most cost saved per extra byte first) reaches: at 77,312 bytes all three miss it. In the second,
# FP16 costs t_b something: where everything fits, FP32 is the only free choice (the lab's FP16 costs nothing, so a
# search that leaves FP32 out would pass on its tables alone).
_SETS: list[tuple[dict[str, tuple[int, int]], dict[str, dict[str, float]]]] = [
    ({"t_query": (300, 16), "t_doc": (1200, 16), "t_author": (90, 64), "t_lang": (12, 64)},
     {"t_query": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0004, "INT2": 0.0031},
      "t_doc": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0001, "INT4": 0.0022, "INT2": 0.0190},
      "t_author": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0003, "INT2": 0.0012},
      "t_lang": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0, "INT2": 0.0006}}),
    ({"t_a": (400, 24), "t_b": (250, 48), "t_c": (60, 8), "t_d": (800, 8), "t_e": (30, 56)},
     {"t_a": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0010, "INT2": 0.0040},
      "t_b": {"FP32": 0.0, "FP16": 0.0001, "INT8": 0.0002, "INT4": 0.0009, "INT2": 0.0070},
      "t_c": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0, "INT2": 0.0002},
      "t_d": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0005, "INT2": 0.0011},
      "t_e": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0001, "INT2": 0.0003}}),
    ({"t_a": (600, 48), "t_b": (1000, 32), "t_c": (1000, 24)},
     {"t_a": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0003, "INT4": 0.0004, "INT2": 0.0024},
      "t_b": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0001, "INT4": 0.0004, "INT2": 0.0005},
      "t_c": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0001, "INT4": 0.0004, "INT2": 0.0004}}),
]


def _bytes_of(tables: Mapping[str, tuple[int, int]], choice: Mapping[str, str]) -> int:
    return sum(rows * _row_bytes(dim, choice[name]) for name, (rows, dim) in tables.items())


def _cost_of(cost: Mapping[str, Mapping[str, float]], choice: Mapping[str, str]) -> float:
    return sum(cost[name][precision] for name, precision in choice.items())


def best_choice(tables: Mapping[str, tuple[int, int]], budget: int, cost: Mapping[str, Mapping[str, float]]) -> dict[str, str] | None:
    """The choice of least total cost within `budget` (fewest bytes among equals), by trying all of them."""
    import itertools

    names = list(tables)
    found = None
    for combo in itertools.product(PRECISIONS, repeat=len(names)):
        choice = dict(zip(names, combo))
        used = _bytes_of(tables, choice)
        if used > budget:
            continue
        key = (round(_cost_of(cost, choice), 9), used)
        if found is None or key < found[0]:
            found = (key, choice)
    return None if found is None else found[1]


def _budgets(tables: Mapping[str, tuple[int, int]]) -> list[int]:
    """Budgets from the tightest (everything INT2) to one where everything fits in fp32, and four between."""
    smallest = _bytes_of(tables, {name: "INT2" for name in tables})
    largest = _bytes_of(tables, {name: "FP32" for name in tables})
    found = [smallest, largest]
    for share in (0.12, 0.25, 0.4, 0.7):
        found.append(int(smallest + share * (largest - smallest)) // 16 * 16)
    return sorted(set(found))


def _summary(choice: Mapping[str, str]) -> str:
    return ", ".join(f"{name.removeprefix('t_')} {precision}" for name, precision in choice.items())


@exercise
def check_precision_choice(
    choose_precisions: Callable[[Mapping[str, tuple[int, int]], int, Mapping[str, Mapping[str, float]]], Mapping[str, str]],
    tables: Mapping[str, tuple[int, int]],
    cost: Mapping[str, Mapping[str, float]],
    budget: int,
) -> None:
    """`choose_precisions(tables, budget_bytes, cost)` returns ``{table: precision}``: every table of `tables`
    (``{name: (rows, dim)}``) served in the unsharded quantized module (rows aligned to 16 bytes), all of them
    within `budget_bytes`, at the least total quality cost, a choice's cost being the sum of
    ``cost[table][precision]`` over its tables.

    The check asks for the lab's tables at `budget` and at other budgets, then for table sets and costs the lab
    does not show; it quantizes each answer's tables (``cheaper.quantize_tables``) and measures their bytes, and
    passes any choice within the budget whose cost is the least any choice within the budget has.
    """
    cases = [(dict(tables), b, cost) for b in [budget] + [b for b in _budgets(tables) if b != budget]]
    cases += [(dict(shapes), b, {name: dict(row) for name, row in costs.items()})  # copies: the check's own sets stay
              for shapes, costs in _SETS for b in _budgets(shapes)]                 # as they are whatever an answer does
    if best_choice(tables, budget, cost) is None:
        fail(f"no choice fits {budget:,} bytes: every table at INT2 takes {_bytes_of(tables, dict.fromkeys(tables, 'INT2')):,}",
             "give the check a budget some choice fits")
    for shapes, limit, costs in cases:
        call = f"choose_precisions(<{len(shapes)} tables: {', '.join(shapes)}>, {limit:,}, cost)"
        try:
            choice = checked_call("choose_precisions", choose_precisions, shapes, limit, costs)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"{call} raised {one_line(error)}",
                 "return a dict {table name: 'FP32' | 'FP16' | 'INT8' | 'INT4' | 'INT2'} for the tables it is given")
        if not isinstance(choice, Mapping):
            fail(f"{call} returned a {type(choice).__name__}", "return a dict {table name: precision}")
        choice = dict(choice)
        if sorted(choice) != sorted(shapes):
            fail(f"{call} named the tables {sorted(choice)}; it was given {sorted(shapes)}",
                 "give a precision to every table of the `tables` argument, and only to those (not the lab's names)")
        unknown = {t: p for t, p in choice.items() if p not in PRECISIONS}
        if unknown:
            fail(f"{call}: unknown precision {unknown}", f"use one of {list(PRECISIONS)}")
        served = cheaper.quantize_tables(shapes, choice)
        used = sum(cheaper.serving_bytes(served).values())
        best = best_choice(shapes, limit, costs)
        if used > limit:
            fail(f"{call}: {_summary(choice)} takes {used:,} bytes, measured: {used - limit:,} bytes over the budget",
                 "count each table's bytes as rows x serving_row_bytes(dim, precision, 16): the scale and bias and the "
                 "padding are bytes too; and use the budget_bytes argument")
        lost, least = _cost_of(costs, choice), _cost_of(costs, best)
        if lost > least + 1e-9:
            fp16_not_free = [name for name in shapes if choice[name] == "FP16" and best[name] == "FP32"
                             and costs[name]["FP16"] > costs[name]["FP32"]]
            fail(f"{call}: {_summary(choice)} fits ({used:,} bytes) but costs {lost:.4f} of AUC, "
                 f"{lost - least:.4f} more than needed: {_summary(best)} fits too ({_bytes_of(shapes, best):,} bytes) "
                 f"and costs {least:.4f}",
                 f"FP32 is a choice too: here FP16 costs {fp16_not_free[0]} {costs[fp16_not_free[0]]['FP16']:.4f} "
                 "(the lab's FP16 happens to cost nothing); try all 5 precisions" if fp16_not_free else
                 "the least total cost among all the choices that fit: with 5 precisions and a few tables, try them all "
                 "(itertools.product); read the costs from the cost argument")
    passed(f"choose_precisions fits the budget at the least cost in {len(cases)} cases: the lab's tables at "
           f"{len(cases) - sum(len(_budgets(shapes)) for shapes, _ in _SETS)} budgets, and {len(_SETS)} table sets it does not show")
