"""Lab 10's checks pass the solutions and reject the mistakes a learner plausibly makes, each with its reason."""
from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F

from course_lib import data
from course_lib.checks import lab10

from conftest import rejects

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------------ exercise 1


def good_fraction(ids, rows):
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    _, per_row = torch.unique(pairs[1], return_counts=True)
    return float(per_row[per_row > 1].sum()) / pairs.shape[1]


def test_shared_row_fraction_passes_the_solution(capsys):
    lab10.check_shared_row_fraction(good_fraction)
    assert capsys.readouterr().out.startswith("✓")


def per_impression(ids, rows):  # every impression counted, an id seen twice counts twice
    _, per_row = torch.unique(rows, return_counts=True)
    return float(per_row[per_row > 1].sum()) / len(ids)


def extra_ids_only(ids, rows):  # the first id in a row does not count as collided
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    _, per_row = torch.unique(pairs[1], return_counts=True)
    return float((per_row[per_row > 1] - 1).sum()) / pairs.shape[1]


def shared_rows(ids, rows):  # a share of rows, not of ids
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    _, per_row = torch.unique(pairs[1], return_counts=True)
    return float((per_row > 1).float().mean())


def rows_lost(ids, rows):  # 1 - rows used / ids: the same number as counting only the extra ids
    return 1 - torch.unique(rows).numel() / torch.unique(ids).numel()


def over_impressions(ids, rows):  # the right ids, divided by the number of impressions
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    _, per_row = torch.unique(pairs[1], return_counts=True)
    return float(per_row[per_row > 1].sum()) / len(ids)


def duplicates_are_collisions(ids, rows):  # compares impressions: the same id twice "collides" with itself
    _, per_row = torch.unique(rows, return_counts=True)
    shared = torch.unique(rows)[per_row > 1]
    return float(torch.isin(rows, shared).float().mean())


def returns_a_count(ids, rows):  # the number of ids, not the share
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    _, per_row = torch.unique(pairs[1], return_counts=True)
    return float(per_row[per_row > 1].sum())


@pytest.mark.parametrize("answer, reason", [
    (per_impression, "counted impressions"),
    (extra_ids_only, "only the extra ids"),
    (shared_rows, "counted rows"),
    (rows_lost, "only the extra ids"),
    (duplicates_are_collisions, "counted impressions"),
    (over_impressions, "divided by the impressions"),
    (returns_a_count, "expected"),
])
def test_shared_row_fraction_rejects(answer, reason):
    rejects(lab10.check_shared_row_fraction, answer, match=reason)


def test_shared_row_fraction_that_raises_is_reported():
    def broken(ids, rows):
        return ids.unique(dim=2)

    rejects(lab10.check_shared_row_fraction, broken, match="raised IndexError")


# ------------------------------------------------------------------------------------------ exercise 2


@pytest.fixture(scope="module")
def log():
    torch.set_num_threads(1)  # as the lab does
    return data.make_drifting_log()


BUDGET, MARGIN = 12 * 1024, 0.005


def answer(choice):
    return lambda budget_bytes: choice


def solution(budget_bytes):
    return {"rows": budget_bytes // 32, "policy": "modulo"}


def test_held_bytes_counts_weights_and_every_buffer():
    # measured in torchrec 1.8: int64 sorted raw ids and remapped ids per row, plus counts (LFU), last-access
    # iterations (LRU) or both (distance LFU); 1,025 output segments and 3 scalars; a 640-entry history buffer
    # (1.25 x a batch of 512) for the policies that keep last-access iterations
    assert lab10.held_bytes(384, "modulo") == 384 * 32
    assert lab10.bytes_per_row("modulo") == (32, 0)
    assert lab10.bytes_per_row("lfu") == (32 + 24, 1025 * 8 + 3 * 8)
    assert lab10.bytes_per_row("lru") == (32 + 24, 1025 * 8 + 3 * 8 + 640 * 8)
    assert lab10.bytes_per_row("distance_lfu") == (32 + 32, 1025 * 8 + 3 * 8 + 640 * 8)
    for policy in lab10.OPTIONS:
        per_row, fixed = lab10.bytes_per_row(policy)
        assert lab10.held_bytes(100, policy) == fixed + 100 * per_row
        rows = lab10.most_rows(BUDGET, policy)
        assert rows == 0 or lab10.held_bytes(rows, policy) <= BUDGET < lab10.held_bytes(rows + 1, policy)


def test_table_choice_passes_the_solution(log, capsys):
    lab10.check_table_choice(solution, log, BUDGET, MARGIN)
    out = capsys.readouterr().out
    assert out.startswith("✓ within the budget, every byte counted, and the margin: 12,288 bytes: modulo, 384 rows")
    assert "16,384 bytes: modulo, 512 rows" in out


def test_the_best_option_is_modulo_at_both_budgets(log):
    # the consequence the check judges by: no managed-collision table that fits comes near modulo's AUC
    for budget in (BUDGET, BUDGET * 4 // 3):
        policy, rows, best = lab10.best_choice(log, budget)
        assert (policy, rows) == ("modulo", budget // 32)
        others = [lab10.mean_auc(log, lab10.most_rows(budget, p), p)[0] for p in lab10.OPTIONS[1:]
                  if lab10.most_rows(budget, p) >= 2]
        assert others and max(others) < best - 2 * MARGIN


@pytest.mark.parametrize("choose, reason", [
    # the lab's rows typed in: it fits the lab's budget, but ignores budget_bytes
    (answer({"rows": 384, "policy": "modulo"}), "the same rows whatever the budget"),
    (lambda b: {"rows": -(-b // 32), "policy": "modulo"}, "round down"),  # ceil: exact on the lab's budgets
    (lambda b: {"rows": round(b / 32), "policy": "modulo"}, "round down"),
])
def test_table_choice_asks_a_budget_that_is_not_whole_rows(log, choose, reason):
    import time

    start = time.perf_counter()
    rejects(lab10.check_table_choice, choose, log, BUDGET, MARGIN, match=reason)
    assert time.perf_counter() - start < 5  # judged on bytes alone, before any training


@pytest.mark.parametrize("choose, reason", [
    # weights only: the old answer, and the same mistake with any managed-collision policy
    (lambda b: {"rows": b // 32, "policy": "distance_lfu"}, "the weights fit, the module does not"),
    (lambda b: {"rows": b // 32, "policy": "lru"}, "the weights fit, the module does not"),
    (lambda b: {"rows": b // 32, "policy": "lfu"}, "the weights fit, the module does not"),
    # the per-row bytes counted, the fixed ones not
    (lambda b: {"rows": b // 64, "policy": "distance_lfu"}, "bytes over the budget"),
    (lambda b: {"rows": b // 56, "policy": "lfu"}, "bytes over the budget"),
    # ignoring the budget
    (answer({"rows": 512, "policy": "lru"}), "bytes over the budget"),  # the size that works, unbounded
    (answer({"rows": 384, "policy": "distance_lfu"}), "the same rows whatever the budget"),
    (lambda b: {"rows": b // 4, "policy": "modulo"}, "bytes over the budget"),  # bytes per value, not per row
    (answer({"rows": 384, "policy": "LRU"}), "policy must be one of"),
    (answer({"rows": 384.0, "policy": "lru"}), "rows must be an int"),
    (lambda b: {"rows": b / 32, "policy": "modulo"}, "rows must be an int"),
    (answer({"rows": 384}), "keys 'rows' and 'policy'"),
    (answer((384, "lru")), "must return a dict"),
    (lambda b: {"rows": 384, "policy": "modulo"}[b], "raised KeyError"),
])
def test_table_choice_rejects_malformed_or_over_budget(log, choose, reason):
    rejects(lab10.check_table_choice, choose, log, BUDGET, MARGIN, match=reason)


def test_over_budget_says_by_how_many_bytes(log):
    message = rejects(lab10.check_table_choice, lambda b: {"rows": b // 32, "policy": "distance_lfu"}, log, BUDGET, MARGIN,
                      match="over the budget")
    held = lab10.held_bytes(288, "distance_lfu")  # the small budget, 9,240 bytes, is asked first
    assert f"{held:,} bytes per table" in message and f"{held - 9_240:,} bytes over the budget of 9,240" in message


@pytest.mark.parametrize("choose, hint", [
    # modulo given fewer rows than the budget allows: half of them, as if every row cost an id map too
    (lambda b: {"rows": b // 64, "policy": "modulo"}, "has room for"),
    (lambda b: {"rows": lab10.most_rows(b, "distance_lfu") or 2, "policy": "modulo"}, "has room for"),
    # a managed-collision table that does fit, with every row it can hold
    (lambda b: {"rows": lab10.most_rows(b, "lfu"), "policy": "lfu"}, "never forgets old counts"),
])
def test_table_choice_measures_and_rejects_the_auc_lost(log, choose, hint):
    rows, policy = choose(BUDGET)["rows"], choose(BUDGET)["policy"]
    got = lab10.mean_auc(log, rows, policy)[0]
    best = lab10.best_choice(log, BUDGET)[2]
    assert got < best - MARGIN  # measured, not assumed
    message = rejects(lab10.check_table_choice, choose, log, BUDGET, MARGIN, match=hint)
    assert f"mean AUC {got:.4f}" in message and "below modulo with 384 rows, the best that fits" in message


# ------------------------------------------------------------------------------------------ exercise 3


def good_shard_of(ids, input_hash_size, world_size):
    return ids // -(-input_hash_size // world_size)


def test_shard_of_passes_the_solution(capsys):
    lab10.check_shard_of(good_shard_of)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("answer, reason", [
    (lambda ids, h, w: ids % w, "id % world_size"),
    (lambda ids, h, w: torch.div(ids, h // w, rounding_mode="floor"), "ceil(input_hash_size / world_size)"),
    (lambda ids, h, w: torch.div(ids, h // w, rounding_mode="floor").clamp(max=w - 1), "disagrees with TorchRec"),
    (lambda ids, h, w: torch.div(ids * w, 2**40, rounding_mode="floor"), "disagrees"),  # assumes 40-bit ids
    (lambda ids, h, w: torch.zeros_like(ids), "disagrees"),  # "everything is on rank 0", true only by default
    (lambda ids, h, w: (ids >= h // 2).long(), "disagrees"),  # two ranks only
    (lambda ids, h, w: ids[:1] // -(-h // w), "shape"),
    # float division: right on every small size, off by 171 ids per block near 2**63
    (lambda ids, h, w: ids // math.ceil(h / w), "divides in floating point"),
    (lambda ids, h, w: torch.floor(ids / -(-h // w)).long(), "divides in floating point"),
    (lambda ids, h, w: torch.div(ids, int(torch.tensor(h / w).ceil()), rounding_mode="floor"), "disagrees"),  # float32
])
def test_shard_of_rejects(answer, reason):
    rejects(lab10.check_shard_of, answer, match=reason)


# ------------------------------------------------------------------------------------------ exercise 4



def good_info_nce(a, b, t):
    return F.cross_entropy(F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / t, torch.arange(len(a)))


def test_info_nce_passes_the_solution(capsys):
    lab10.check_info_nce(good_info_nce)
    assert capsys.readouterr().out.startswith("✓ info_nce")


def _sim(a, b):
    return F.normalize(a, dim=1) @ F.normalize(b, dim=1).T


@pytest.mark.parametrize("answer, reason", [
    (lambda a, b, t: F.cross_entropy(_sim(a, b), torch.arange(len(a))), "ignores the temperature"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) * t, torch.arange(len(a))), "multiplies by the temperature"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b).T / t, torch.arange(len(a))), "transposed similarity"),
    (lambda a, b, t: F.cross_entropy(_sim(b, a) / t, torch.arange(len(a))), "transposed similarity"),
    (lambda a, b, t: (F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)))
                      + F.cross_entropy(_sim(a, b).T / t, torch.arange(len(a)))) / 2, "averages both directions"),
    (lambda a, b, t: F.cross_entropy(a @ b.T / t, torch.arange(len(a))), "raw dot products"),
    (lambda a, b, t: F.cross_entropy(F.normalize(a, dim=0) @ F.normalize(b, dim=0).T / t, torch.arange(len(a))),
     "wrong axis (dim=0)"),
    # a softmax over each column is the transposed loss: the same mistake, the same message
    (lambda a, b, t: -torch.log_softmax(_sim(a, b) / t, dim=0).diagonal().mean(), "transposed similarity"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)), reduction="sum"), "sums over the rows"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)).flip(0)), "labels reversed"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.zeros(len(a), dtype=torch.long)), "expected"),
    pytest.param(lambda a, b, t: float(good_info_nce(a, b, t)), "training needs a tensor",
                 marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")),
    (lambda a, b, t: good_info_nce(a, b, t).detach(), "no gradient"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)), reduction="none"), "a loss is one number"),
    (lambda a, b, t: F.mse_loss(F.normalize(a, dim=1), F.normalize(b, dim=1)), "expected"),
    (lambda a, b, t: good_info_nce(a, b, 0.1), "expected"),  # a temperature typed in
    (lambda a, b, t: (lambda s: (torch.logsumexp(s.masked_fill(torch.eye(len(a), dtype=torch.bool), float("-inf")), 1)
                                 - s.diagonal()).mean())(_sim(a, b) / t), "expected"),  # the positive left out of the denominator
    # the right value, the wrong gradients
    (lambda a, b, t: good_info_nce(a, b.detach(), t), "no gradient reaches content_emb"),  # content tower never trains
    (lambda a, b, t: good_info_nce(a.detach(), b, t), "no gradient reaches id_emb"),
    pytest.param(lambda a, b, t: torch.tensor(float(good_info_nce(a, b, t)), requires_grad=True), "no gradient reaches",
                 marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")),
    (lambda a, b, t: F.cross_entropy((a / a.norm(dim=1, keepdim=True).detach()) @ (b / b.norm(dim=1, keepdim=True).detach()).T
                                     / t, torch.arange(len(a))), "gradient with respect to id_emb"),  # norms detached
])
def test_info_nce_rejects(answer, reason):
    rejects(lab10.check_info_nce, answer, match=reason)


# ------------------------------------------------------------ answers that change what they were handed (issue 25)


def fraction_sorting_in_place(ids, rows):  # the right fraction, but the caller's ids and rows are now reordered
    order = torch.argsort(ids)
    ids[:] = ids[order].clone()
    rows[:] = rows[order].clone()
    return good_fraction(ids, rows)


def shard_of_dividing_in_place(ids, input_hash_size, world_size):  # the right owners, written over the caller's ids
    ids //= -(-input_hash_size // world_size)
    return ids


@pytest.mark.parametrize("check, answer, name", [
    (lab10.check_shared_row_fraction, fraction_sorting_in_place, "shared_row_fraction"),
    (lab10.check_shard_of, shard_of_dividing_in_place, "shard_of"),
])
def test_answers_that_change_their_input_are_rejected(check, answer, name):
    message = rejects(check, answer, match=f"{name} changed its argument 1 (a torch.int64 tensor")
    assert "work on a copy" in message
