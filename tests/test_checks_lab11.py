"""Lab 11's checks pass the solutions and reject the mistakes a learner plausibly makes, each with its reason."""
from __future__ import annotations

import itertools

import pytest
import torch

from course_lib import cheaper
from course_lib.checks import lab11

from conftest import rejects


# ------------------------------------------------------------------------------------------ exercise 1: qcomm sharder


def sharder_from(forward, backward, lr, device, *, comm_ops=None, optimizer="rowwise", swap=False, fix_device="given"):
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

    if swap:
        forward, backward = backward, forward
    device = {"given": device, "cpu": "cpu", "none": None}[fix_device]
    config = QCommsConfig(forward_precision=CommType[forward], backward_precision=CommType[backward])
    registry = get_qcomm_codecs_registry(config, comm_ops=comm_ops, device=torch.device(device) if device else None)
    fused = {"learning_rate": lr}
    if optimizer == "rowwise":
        fused["optimizer"] = EmbOptimType.EXACT_ROWWISE_ADAGRAD
    elif optimizer == "adagrad":
        fused["optimizer"] = EmbOptimType.EXACT_ADAGRAD
    return EmbeddingBagCollectionSharder(fused_params=fused, qcomm_codecs_registry=registry)


def test_qcomm_sharder_passes_the_solution(capsys):
    lab11.check_qcomm_sharder(sharder_from)
    assert capsys.readouterr().out.startswith("✓")


def test_qcomm_sharder_rejects_no_codecs():
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    rejects(lab11.check_qcomm_sharder,
            lambda f, b, lr, d: EmbeddingBagCollectionSharder(
                fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": lr}),
            match="no qcomm_codecs_registry")


def test_qcomm_sharder_rejects_swapped_precisions():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, d, swap=True), match="swapped")


def test_qcomm_sharder_rejects_a_device_left_out():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, d, fix_device="none"),
            match="another device")


def test_qcomm_sharder_explains_a_device_passed_on_as_a_string():
    def passes_the_string(forward, backward, lr, device):
        from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
        from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry

        config = QCommsConfig(forward_precision=CommType[forward], backward_precision=CommType[backward])
        registry = get_qcomm_codecs_registry(config, device=device)  # "cpu", not torch.device("cpu")
        return EmbeddingBagCollectionSharder(fused_params={"learning_rate": lr}, qcomm_codecs_registry=registry)

    message = rejects(lab11.check_qcomm_sharder, passes_the_string, match="raised AttributeError")
    assert "torch.device(device)" in message


def test_qcomm_sharder_rejects_a_device_hard_coded():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, d, fix_device="cpu"),
            match="another device")


def test_qcomm_sharder_rejects_every_device_taken_for_the_cpu():
    # adversarial round 2: torch.device("cpu") whenever a device is given passed while the check asked only for "cpu"
    # and None; on "cuda" the codecs must keep BF16
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, "cpu" if d is not None else None),
            match="qcomm_sharder('FP16', 'BF16', 0.2, 'cuda'): the all-to-all codecs are forward FP16, backward FP16; "
                  "expected FP16, BF16\nhint: the codecs were built for another device than the one asked for ('cuda'): "
                  "BF16 came back as FP16, which they do only for the CPU")


def test_qcomm_sharder_rejects_the_default_optimizer():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, d, optimizer=None),
            match="exact SGD")


def test_qcomm_sharder_rejects_per_element_adagrad():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, d, optimizer="adagrad"),
            match="fused optimizer is")


def test_qcomm_sharder_rejects_a_hard_coded_rate():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, 0.1, d), match="learning rate")


def test_qcomm_sharder_rejects_codecs_for_the_all_to_all_only():
    from torchrec.distributed.types import CommOp

    rejects(lab11.check_qcomm_sharder,
            lambda f, b, lr, d: sharder_from(f, b, lr, d, comm_ops=[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL]),
            match="reduce-scatter")


def test_qcomm_sharder_rejects_precisions_mapped_for_the_lab_s_names_only():
    from torchrec.distributed.fbgemm_qcomm_codec import CommType

    def fp16_or_bf16(forward, backward, lr, device):  # any name but "FP16" becomes BF16
        name = {CommType.FP16: "FP16", CommType.BF16: "BF16"}
        pick = lambda p: name[CommType.FP16 if p == "FP16" else CommType.BF16]  # noqa: E731
        return sharder_from(pick(forward), pick(backward), lr, device)

    rejects(lab11.check_qcomm_sharder, fp16_or_bf16, match="expected FP16, INT8")


def test_qcomm_sharder_rejects_a_registry_for_the_wrong_precision():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from("FP16", "FP16", lr, d), match="expected")


def test_qcomm_sharder_rejects_a_hard_coded_precision_pair():
    # the lab's FP16 / BF16 whatever it is asked
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from("FP16", "BF16", lr, d), match="the lab's pair")


def sharder_with_reduce_scatter(forward, backward, lr, device, *, reduce_scatter):
    """The all-to-all's codecs as asked, the reduce-scatter's built separately from `reduce_scatter`'s pair."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.fbgemm_qcomm_codec import CommType, QCommsConfig, get_qcomm_codecs_registry
    from torchrec.distributed.types import CommOp

    all_to_all = sharder_from(forward, backward, lr, device, comm_ops=[CommOp.POOLED_EMBEDDINGS_ALL_TO_ALL])
    registry = all_to_all.qcomm_codecs_registry
    rs_forward, rs_backward = reduce_scatter(forward, backward)
    registry.update(get_qcomm_codecs_registry(
        QCommsConfig(forward_precision=CommType[rs_forward], backward_precision=CommType[rs_backward]),
        comm_ops=[CommOp.POOLED_EMBEDDINGS_REDUCE_SCATTER], device=torch.device(device) if device else None))
    return EmbeddingBagCollectionSharder(fused_params=all_to_all.fused_params, qcomm_codecs_registry=registry)


def test_qcomm_sharder_passes_the_two_collectives_built_separately(capsys):
    lab11.check_qcomm_sharder(
        lambda f, b, lr, d: sharder_with_reduce_scatter(f, b, lr, d, reduce_scatter=lambda f, b: (f, b)))
    assert capsys.readouterr().out.startswith("✓")


def test_qcomm_sharder_rejects_the_lab_s_pair_on_the_reduce_scatter():
    # only the all-to-all follows the arguments: row-wise tables' reduce-scatter stays at the lab's FP16 / BF16
    rejects(lab11.check_qcomm_sharder,
            lambda f, b, lr, d: sharder_with_reduce_scatter(f, b, lr, d, reduce_scatter=lambda f, b: ("FP16", "BF16")),
            match="the reduce-scatter codecs are forward FP16, backward FP16, the lab's pair")


def test_qcomm_sharder_rejects_a_swapped_reduce_scatter():
    # "the reduce-scatter runs in backward, so it takes the backward precision first"
    rejects(lab11.check_qcomm_sharder,
            lambda f, b, lr, d: sharder_with_reduce_scatter(f, b, lr, d, reduce_scatter=lambda f, b: (b, f)),
            match="the reduce-scatter codecs are forward BF16, backward FP16: swapped")


def test_qcomm_sharder_rejects_a_cached_sharder():
    cache = {}

    def wrong(f, b, lr, d):  # the first call's sharder for every call
        return cache.setdefault("sharder", sharder_from(f, b, lr, d))

    rejects(lab11.check_qcomm_sharder, wrong, match="learning rate")


SHARED_REGISTRY: dict = {}


def one_registry_for_all(f, b, lr, d):  # every sharder holds the module-level registry, updated by the last call
    SHARED_REGISTRY.clear()
    SHARED_REGISTRY.update(sharder_from(f, b, lr, d).qcomm_codecs_registry)
    return type(sharder_from(f, b, lr, d))(fused_params=sharder_from(f, b, lr, d).fused_params,
                                           qcomm_codecs_registry=SHARED_REGISTRY)


def test_qcomm_sharder_rejects_sharders_that_share_one_registry():
    # each sharder is right when it is made, and becomes the last one's when the next is made
    message = rejects(lab11.check_qcomm_sharder, one_registry_for_all,
                      match="calling qcomm_sharder again changed an EmbeddingBagCollectionSharder that an earlier "
                            "call of it had returned (call 1): it keeps state between calls")
    assert "build what you return afresh in each call" in message


# ------------------------------------------------------------------------------------------ exercise 2: dedup


def good_deduplicate(users, items):
    from torchrec import KeyedJaggedTensor

    distinct, inverse = torch.unique(users, return_inverse=True)
    per_request = len(items) // len(users)
    return KeyedJaggedTensor(
        keys=["user", "item"], values=torch.cat([distinct, items]),
        lengths=torch.ones(len(distinct) + len(items), dtype=torch.long),
        stride_per_key_per_rank=[[len(distinct)], [len(items)]],
        inverse_indices=(["user", "item"], torch.stack([inverse.repeat_interleave(per_request), torch.arange(len(items))])),
    )


def test_deduplicate_passes_the_solution(capsys):
    lab11.check_deduplicate(good_deduplicate)
    assert capsys.readouterr().out.startswith("✓")


def test_deduplicate_rejects_per_request_dedup():
    rejects(lab11.check_deduplicate, lambda u, i: cheaper.request_batches(u, i)[1], match="torch.unique")


def test_deduplicate_rejects_a_flat_batch():
    rejects(lab11.check_deduplicate, lambda u, i: cheaper.request_batches(u, i)[0], match="flat batch")


def test_deduplicate_rejects_inverse_indices_in_request_order():
    from torchrec import KeyedJaggedTensor

    def wrong(users, items):  # distinct users sent, but rows point at request numbers, not at the distinct users
        distinct = torch.unique(users)
        per_request = len(items) // len(users)
        rows = torch.arange(len(users)).clamp(max=len(distinct) - 1).repeat_interleave(per_request)
        return KeyedJaggedTensor(
            keys=["user", "item"], values=torch.cat([distinct, items]),
            lengths=torch.ones(len(distinct) + len(items), dtype=torch.long),
            stride_per_key_per_rank=[[len(distinct)], [len(items)]],
            inverse_indices=(["user", "item"], torch.stack([rows, torch.arange(len(items))])),
        )

    rejects(lab11.check_deduplicate, wrong, match="differs from the flat batch")


def test_deduplicate_rejects_missing_inverse_indices():
    from torchrec import KeyedJaggedTensor

    def wrong(users, items):
        distinct = torch.unique(users)
        return KeyedJaggedTensor(keys=["user", "item"], values=torch.cat([distinct, items]),
                                 lengths=torch.ones(len(distinct) + len(items), dtype=torch.long),
                                 stride_per_key_per_rank=[[len(distinct)], [len(items)]])

    rejects(lab11.check_deduplicate, wrong, match="no inverse_indices")


def test_deduplicate_rejects_items_in_the_wrong_order():
    def wrong(users, items):
        kjt = good_deduplicate(users, items)
        keys, inverse = kjt.inverse_indices()
        from torchrec import KeyedJaggedTensor

        return KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(),
                                 stride_per_key_per_rank=kjt.stride_per_key_per_rank(),
                                 inverse_indices=(keys, torch.stack([inverse[0], inverse[1].flip(0)])))

    rejects(lab11.check_deduplicate, wrong, match="differs from the flat batch")


def test_deduplicate_rejects_swapped_keys():
    from torchrec import KeyedJaggedTensor

    def wrong(users, items):
        kjt = good_deduplicate(users, items)
        return KeyedJaggedTensor(keys=["item", "user"], values=kjt.values(), lengths=kjt.lengths(),
                                 stride_per_key_per_rank=kjt.stride_per_key_per_rank(),
                                 inverse_indices=(["item", "user"], kjt.inverse_indices()[1]))

    rejects(lab11.check_deduplicate, wrong, match="in that order")


def test_deduplicate_rejects_sorting_the_caller_s_users_in_place():
    def wrong(users, items):  # sorts the caller's tensor, then deduplicates it
        users.copy_(users.sort().values)
        return good_deduplicate(users, items)

    rejects(lab11.check_deduplicate, wrong, match="changed its argument 1")


def test_deduplicate_rejects_changing_the_caller_s_items_in_place():
    def wrong(users, items):
        kjt = good_deduplicate(users, items)
        items.zero_()
        return kjt

    rejects(lab11.check_deduplicate, wrong, match="changed its argument 2")


# ------------------------------------------------------------------------------------------ exercise 3: row bytes

BITS = {"FP32": 32, "FP16": 16, "INT8": 8, "INT4": 4, "INT2": 2}


def round_up(n, to):
    return -(-n // to) * to


def good_row_bytes(dim, precision, row_alignment):
    return round_up(dim * BITS[precision] // 8 + (4 if precision.startswith("INT") else 0), row_alignment)


def test_row_bytes_passes_the_solution(capsys):
    lab11.check_serving_row_bytes(good_row_bytes)
    assert capsys.readouterr().out.startswith("✓")


def test_the_measured_row_bytes_are_fbgemm_s_formula():
    for alignment in lab11.ALIGNMENTS:
        for (dim, precision), got in lab11.measured_row_bytes(lab11.ROW_CASES, alignment).items():
            assert got == lab11._row_bytes(dim, precision, alignment), (dim, precision, alignment)


def q(p):
    return 4 if p.startswith("INT") else 0


@pytest.mark.parametrize(
    "wrong, match",
    [
        (lambda d, p, a: d * BITS[p] // 8, "padded to a multiple of row_alignment"),                              # no scale/bias, no padding
        (lambda d, p, a: d * BITS[p] // 8 + q(p), "padded to a multiple"),                           # no padding
        (lambda d, p, a: round_up(d * BITS[p] // 8, a), "an fp16 scale and an fp16 bias"),  # padding, no scale/bias
        (lambda d, p, a: round_up(d * BITS[p] // 8 + 2 * q(p), a), "2 bytes each, 4 in all"),   # fp32 scale and bias
        (lambda d, p, a: round_up(d * BITS[p] // 8 + q(p) // 2, a), "(some of) the 4 bytes"),      # a scale, no bias
        (lambda d, p, a: round_up(d * BITS[p] // 8 + 4, a), "carry no scale or bias"),          # scale/bias on float rows
        (lambda d, p, a: d * BITS[p], "bits, not bytes"),
        (lambda d, p, a: round_up(d * (1 if p.startswith("INT") else BITS[p] // 8) + q(p), a), "values per byte"),
        # the row alignment ignored: always the unsharded module's 16 (right for every case at 16)
        (lambda d, p, a: round_up(d * BITS[p] // 8 + q(p), 16), "the padding is the argument's"),
        # fp32 and fp16 rows taken as unpadded: right wherever dim x 4 (or 2) is a multiple of the alignment
        (lambda d, p, a: d * BITS[p] // 8 if p.startswith("FP") else good_row_bytes(d, p, a), "padded to a multiple"),
        # right at the lab's width only: a hard-coded table of the five rows of 32 values
        (lambda d, p, a: {"FP32": 128, "FP16": 64, "INT8": 48, "INT4": 32, "INT2": 16}[p], "measures"),
    ],
)
def test_row_bytes_rejects(wrong, match):
    rejects(lab11.check_serving_row_bytes, wrong, match=match)


def test_row_bytes_rejects_a_float():
    rejects(lab11.check_serving_row_bytes, lambda d, p, a: float(good_row_bytes(d, p, a)), match="a number of bytes is an int")


def test_row_bytes_passes_a_numpy_integer(capsys):
    import numpy as np

    # np.ceil(n / a).astype(np.int64) * a: a NumPy integer, exact
    lab11.check_serving_row_bytes(lambda d, p, a: np.int64(good_row_bytes(d, p, a)))
    assert capsys.readouterr().out.startswith("✓")


def test_row_bytes_reports_an_error_as_text():
    rejects(lab11.check_serving_row_bytes, lambda d, p, a: {"int8": 1}[p], match="raised KeyError")


# ------------------------------------------------------------------------------------------ exercise 4: precisions

PRECISIONS = ["FP32", "FP16", "INT8", "INT4", "INT2"]
TABLES = {"t_user": (500, 32), "t_item": (200, 32), "t_category": (20, 32), "t_terms": (50, 32)}
# the lab's measured costs, rounded (one run; the check's own table sets carry their own)
COST = {"t_user": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0, "INT2": 0.0033},
        "t_item": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0, "INT2": 0.0058},
        "t_category": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0, "INT2": 0.0010},
        "t_terms": {"FP32": 0.0, "FP16": 0.0, "INT8": 0.0, "INT4": 0.0, "INT2": 0.0011}}
BUDGET = 20_000


def table_bytes(tables, choice, row_bytes=good_row_bytes):
    return sum(rows * row_bytes(dim, choice[name], 16) for name, (rows, dim) in tables.items())


def good_choice(tables, budget, cost, row_bytes=good_row_bytes):
    fits = [dict(zip(tables, combo)) for combo in itertools.product(PRECISIONS, repeat=len(tables))]
    fits = [choice for choice in fits if table_bytes(tables, choice, row_bytes) <= budget]
    return min(fits, key=lambda choice: sum(cost[name][p] for name, p in choice.items()))


def check(choice):
    lab11.check_precision_choice(choice, TABLES, COST, BUDGET)


def test_precision_choice_passes_the_solution(capsys):
    check(good_choice)
    assert capsys.readouterr().out.startswith("✓")


def test_precision_choice_passes_any_least_cost_choice(capsys):
    def most_bytes(tables, budget, cost):  # among the choices of least cost, the one with the most bytes
        fits = [dict(zip(tables, combo)) for combo in itertools.product(PRECISIONS, repeat=len(tables))]
        fits = [choice for choice in fits if table_bytes(tables, choice) <= budget]
        return min(fits, key=lambda c: (round(sum(cost[n][p] for n, p in c.items()), 9), -table_bytes(tables, c)))

    check(most_bytes)
    assert capsys.readouterr().out.startswith("✓")


def lab_answer(tables, budget, cost):  # the lab's answer, whatever it is asked
    return {name: "INT2" if name == "t_user" else "INT4" for name in TABLES}


def greedy(tables, budget, cost):
    """Start in FP32; while over budget, lower the table whose next step saves the most bytes per cost."""
    choice = {name: "FP32" for name in tables}
    while table_bytes(tables, choice) > budget:
        def gain(name):
            step = PRECISIONS[PRECISIONS.index(choice[name]) + 1]
            saved = tables[name][0] * (good_row_bytes(tables[name][1], choice[name], 16) - good_row_bytes(tables[name][1], step, 16))
            return saved / (cost[name][step] - cost[name][choice[name]] + 1e-6)
        name = max((n for n in tables if choice[n] != "INT2"), key=gain)
        choice[name] = PRECISIONS[PRECISIONS.index(choice[name]) + 1]
    return choice


def fits(tables, budget):
    choices = [dict(zip(tables, combo)) for combo in itertools.product(PRECISIONS, repeat=len(tables))]
    return [choice for choice in choices if table_bytes(tables, choice) <= budget]


def total(cost, choice):
    return sum(cost[name][p] for name, p in choice.items())


def least_worst_table(tables, budget, cost):
    """The least worst-table cost first, then the least sum."""
    return min(fits(tables, budget), key=lambda c: (max(cost[n][p] for n, p in c.items()), total(cost, c)))


def fewest_tables_hurt(tables, budget, cost):
    """As few tables with any cost as possible, then the least sum."""
    return min(fits(tables, budget), key=lambda c: (sum(cost[n][p] > 0 for n, p in c.items()), total(cost, c)))


def greedy_upward(tables, budget, cost):
    """Start at all INT2; while some step up fits, take the one that saves the most cost per extra byte."""
    choice = {name: "INT2" for name in tables}
    while True:
        best = None
        for name in tables:
            i = PRECISIONS.index(choice[name])
            if i == 0:
                continue
            up = dict(choice, **{name: PRECISIONS[i - 1]})
            extra = table_bytes(tables, up) - table_bytes(tables, choice)
            if table_bytes(tables, up) > budget:
                continue
            score = ((cost[name][choice[name]] - cost[name][up[name]]) / max(extra, 1), -extra)
            if best is None or score > best[0]:
                best = (score, up)
        if best is None:
            return choice
        choice = best[1]


def without_fp32(tables, budget, cost):
    """Every choice but FP32's: the lab's FP16 costs nothing, so FP16 looks at least as good (adversarial round 2)."""
    choices = [dict(zip(tables, combo)) for combo in itertools.product(PRECISIONS[1:], repeat=len(tables))]
    return min((c for c in choices if table_bytes(tables, c) <= budget), key=lambda c: total(cost, c))


@pytest.mark.parametrize(
    "wrong, match",
    [
        (without_fp32, "FP32 is a choice too: here FP16 costs t_b 0.0001"),
        (lab_answer, "over the budget"),                                                  # hard-codes the lab's answer
        (lambda t, b, c: {n: "INT2" for n in t}, "more than needed"),                    # always the smallest
        (lambda t, b, c: {n: "INT4" for n in t}, "over the budget"),                     # one precision for all
        (lambda t, b, c: good_choice(t, BUDGET, c), "over the budget"),                  # the lab's budget, not the argument
        (lambda t, b, c: good_choice(t, b, {n: COST["t_user"] for n in t}), "more than needed"),  # the cost argument ignored
        (lambda t, b, c: good_choice(t, b, c, row_bytes=lambda d, p, a: d * BITS[p] // 8), "over the budget"),  # values only
        (lambda t, b, c: good_choice(t, b, c, row_bytes=lambda d, p, a: round_up(d * BITS[p] // 8, 16)), "over the budget"),
        (greedy, "more than needed"),                                                    # a greedy search
        # another objective than the total: the worst table, or the number of tables touched; or a greedy climb
        (least_worst_table, "a INT4, b INT4, c INT4 fits (67,200 bytes) but costs 0.0012"),
        (fewest_tables_hurt, "a INT2, b INT2, c FP16 fits (73,600 bytes) but costs 0.0029"),
        (greedy_upward, "a INT4, b INT4, c INT4 fits (67,200 bytes) but costs 0.0012"),
        (lambda t, b, c: {n: "int4" for n in t}, "unknown precision"),
        (lambda t, b, c: {n: torch.quint4x2 for n in t}, "unknown precision"),
        (lambda t, b, c: dict(list(good_choice(t, b, c).items())[:2]), "named the tables"),   # tables left out
        (lambda t, b, c: list(good_choice(t, b, c).values()), "returned a list"),
    ],
)
def test_precision_choice_rejects(wrong, match):
    rejects(lab11.check_precision_choice, wrong, TABLES, COST, BUDGET, match=match)


def test_precision_choice_rejects_an_answer_that_changes_the_costs():
    def wrong(tables, budget, cost):
        for name in cost:
            cost[name].pop("FP32")  # "FP32 is never a choice under a budget"
        return good_choice(tables, budget, {n: dict(c, FP32=1.0) for n, c in cost.items()})

    rejects(lab11.check_precision_choice, wrong, dict(TABLES), {n: dict(c) for n, c in COST.items()}, BUDGET,
            match="changed its argument 3")


def test_precision_choice_rejects_an_answer_that_changes_the_tables():
    def wrong(tables, budget, cost):
        choice = good_choice(tables, budget, cost)
        tables.clear()
        return choice

    rejects(lab11.check_precision_choice, wrong, TABLES, COST, BUDGET, match="changed its argument 1")
