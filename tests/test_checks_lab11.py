"""Lab 11's checks pass the solutions and reject the mistakes a learner plausibly makes, each with its reason."""
from __future__ import annotations

import pytest
import torch

from course_lib import cheaper, data
from course_lib.checks import lab11

from conftest import rejects


# ------------------------------------------------------------------------------------------ exercise 1: row bytes

BITS = {"FP32": 32, "FP16": 16, "INT8": 8, "INT4": 4, "INT2": 2}


def round_up(n, to):
    return -(-n // to) * to


def good_row_bytes(dim, precision):
    return round_up(dim * BITS[precision] // 8 + (4 if precision.startswith("INT") else 0), 16)


def test_row_bytes_passes_the_solution(capsys):
    lab11.check_serving_row_bytes(good_row_bytes)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, match",
    [
        (lambda d, p: d * BITS[p] // 8, "4-byte scale and bias"),                                      # no scale/bias, no padding
        (lambda d, p: d * BITS[p] // 8 + (4 if p.startswith("INT") else 0), "unpadded"),      # no padding
        (lambda d, p: round_up(d * BITS[p] // 8, 16), "4-byte scale and bias"),   # padding, no scale/bias
        (lambda d, p: round_up(d * BITS[p] // 8 + (8 if p.startswith("INT") else 0), 16), "2 bytes each"),  # fp32 scale+bias
        (lambda d, p: round_up(d * BITS[p] // 8 + (4 if p.startswith("INT") else 0), 8), "not 8"),  # wrong alignment
        (lambda d, p: round_up(d * BITS[p] // 8 + 4, 16), "carry no scale or bias"),          # scale/bias on float rows
        (lambda d, p: d * BITS[p], "bits, not bytes"),
        (lambda d, p: round_up(d * (1 if p.startswith("INT") else BITS[p] // 8) + (4 if p.startswith("INT") else 0), 16),
         "kernel stores"),                                                                   # every integer type as one byte
        # fp32 rows taken as stored unpadded: right for every width that is a multiple of 4
        (lambda d, p: d * 4 if p == "FP32" else round_up(d * BITS[p] // 8 + (4 if p.startswith("INT") else 0), 16),
         "FP32 rows are padded"),
        # a 2-byte scale and no bias: right wherever values + 4 and values + 2 round up to the same 16 bytes
        (lambda d, p: round_up(d * BITS[p] // 8 + (2 if p.startswith("INT") else 0), 16), "returned 16; the kernel stores 32"),
    ],
)
def test_row_bytes_rejects(wrong, match):
    rejects(lab11.check_serving_row_bytes, wrong, match=match)


def test_row_bytes_reports_an_error_as_text():
    rejects(lab11.check_serving_row_bytes, lambda d, p: {"int8": 1}[p], match="raised KeyError")


# ------------------------------------------------------------------------------------------ exercise 2: qcomm sharder


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


def test_qcomm_sharder_rejects_a_device_hard_coded():
    rejects(lab11.check_qcomm_sharder, lambda f, b, lr, d: sharder_from(f, b, lr, d, fix_device="cpu"),
            match="another device")


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


# ------------------------------------------------------------------------------------------ exercise 3: precisions


@pytest.fixture(scope="module")
def served():
    torch.set_num_threads(1)
    log = data.make_click_log(data.ClickLogConfig(num_train=100_000, num_test=20_000))
    return cheaper.train_reference(log), log


NAMES = ["t_user", "t_item", "t_category", "t_terms"]


def good_choice(budget):
    if budget >= 770 * 32:
        return {name: "INT4" for name in NAMES}
    return {name: "INT2" if name == "t_user" else "INT4" for name in NAMES}


def check(choice, served):
    model, log = served
    lab11.check_precision_choice(choice, model, log, (20_000, 30_000), 0.006)


def test_precision_choice_passes_the_solution(served, capsys):
    check(good_choice, served)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, match",
    [
        (lambda b: {n: "FP32" for n in NAMES}, "takes 98,560 bytes"),       # no quantization
        (lambda b: {n: "INT8" for n in NAMES}, "4-byte scale and bias"),    # INT8 thought to be 1 byte per value
        (lambda b: {n: "INT4" for n in NAMES}, "takes 24,640 bytes"),       # budget ignored
        (lambda b: {n: "INT2" for n in NAMES}, "margin"),                   # smallest everywhere: AUC falls
        (lambda b: {n: "INT2" if n == "t_item" else "INT4" for n in NAMES}, "takes 21,440"),  # INT2 on the wrong table
        (lambda b: {n: "INT2" for n in NAMES[:2]}, "tables are"),           # two tables left out
        (lambda b: {n: "int4" for n in NAMES}, "unknown precision"),
        (lambda b: {n: torch.quint4x2 for n in NAMES}, "unknown precision"),
    ],
)
def test_precision_choice_rejects(served, wrong, match):
    model, log = served
    rejects(lab11.check_precision_choice, wrong, model, log, (20_000, 30_000), 0.006, match=match)


# ------------------------------------------------------------------------------------------ exercise 4: dedup


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
