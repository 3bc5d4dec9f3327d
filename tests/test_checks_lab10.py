"""Lab 10's checks pass the solutions and reject the mistakes a learner plausibly makes, each with its reason."""
from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F

from course_lib import collisions, data
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
    assert "9,240 bytes: modulo, 288 rows" in out


def test_the_best_option_is_modulo_at_both_budgets(log):
    # the consequence the check judges by: no managed-collision table that fits comes near modulo's AUC
    small = BUDGET * 3 // 4 + 24  # the check's third budget: 288.75 fp32 rows
    for budget in (BUDGET, BUDGET * 4 // 3, small):
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


def test_table_choice_judges_the_smaller_budget_too(log):
    # right at the lab's budget and a third more, and only a token table below them
    def two_budgets_typed_in(b):
        return {"rows": {BUDGET: BUDGET // 32, BUDGET * 4 // 3: BUDGET * 4 // 3 // 32}.get(b, 2), "policy": "modulo"}

    rejects(lab10.check_table_choice, two_budgets_typed_in, log, BUDGET, MARGIN, match="has room for")


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
    assert capsys.readouterr().out.startswith("✓ shard_of sends every id where TorchRec's row-wise input distribution")


def test_the_reference_is_torchrecs_own_routing():
    # the check compares with TorchRec's bucketization (RwSparseFeaturesDist's block sizes, fbgemm's
    # block_bucketize_sparse_features), not with a formula: the formula agrees with it on every case
    for what, ids, hash_size, world in lab10._shard_cases():
        owners = lab10.torchrec_owners(ids, hash_size, world)
        assert torch.equal(owners, lab10.shard_of(ids, hash_size, world)), what
    # hand-checked: blocks of 334 for 1,000 ids on 3 ranks; of 3 for 9 on 4 (the last rank owns none); of 1 for 3 on 5
    assert lab10.torchrec_owners(torch.tensor([0, 333, 334, 667, 668, 999]), 1_000, 3).tolist() == [0, 0, 1, 1, 2, 2]
    assert lab10.torchrec_owners(torch.arange(9), 9, 4).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert lab10.torchrec_owners(torch.arange(3), 3, 5).tolist() == [0, 1, 2]


@pytest.mark.filterwarnings("ignore:launch. 3 ranks on 2 CPU cores")  # 3 ranks so that 3 does not divide the range
def test_torchrec_owners_is_where_a_real_sharded_table_keeps_the_ids():
    # the consequence, measured: a 30-row managed-collision table sharded row-wise over 3 gloo ranks, with an
    # input_hash_size 3 does not divide, keeps each id on the rank torchrec_owners names (and on no other)
    from course_lib import launch

    hash_size, world = 1_000, 3
    ids = torch.cat([lab10._edges(hash_size, world), torch.randint(0, hash_size, (10,), generator=torch.Generator().manual_seed(5))])
    parts = launch(collisions.sharded_residents, 30, "lru", hash_size, [[ids] * world], world_size=world, show_ranks=[])
    owners = lab10.torchrec_owners(ids, hash_size, world)
    for rank, part in enumerate(parts):
        assert set(part["residents"]) == set(ids[owners == rank].tolist())
    assert [int((owners == r).sum() > 0) for r in range(world)] == [1, 1, 1]


def test_shard_of_cases_are_not_the_labs():
    sizes = {(h, w) for _, _, h, w in lab10._shard_cases()}
    assert not sizes & {(2**63 - 1, 2), (2**40, 2)}  # the two the lab runs
    assert any(h % w for h, w in sizes) and any(h < w for h, w in sizes) and any(h == 2**63 - 1 for h, _ in sizes)


@pytest.mark.parametrize("answer", [
    lambda ids, h, w: torch.div(ids, -(-h // w), rounding_mode="floor"),
    lambda ids, h, w: [int(i) // ((h + w - 1) // w) for i in ids],  # a list of Python ints
    lambda ids, h, w: (ids // -(-h // w)).int(),  # int32 ranks
    lambda ids, h, w: torch.bucketize(ids, torch.arange(1, w) * -(-h // w), right=True),
])
def test_shard_of_passes_other_right_answers(answer):
    lab10.check_shard_of(answer)


def balanced_blocks(ids, h, w):  # tensor_split / np.array_split sizes: the first h % w blocks one longer
    sizes = [h // w + (r < h % w) for r in range(w)]
    starts = torch.tensor([sum(sizes[:r]) for r in range(1, w)], dtype=torch.long)
    return torch.bucketize(ids, starts, right=True)


@pytest.mark.parametrize("answer, reason", [
    (lambda ids, h, w: ids % w, "id % world_size"),
    # right only when world_size divides input_hash_size
    (lambda ids, h, w: torch.div(ids, h // w, rounding_mode="floor"), "right only when world_size divides"),
    (lambda ids, h, w: torch.div(ids, h // w, rounding_mode="floor").clamp(max=w - 1), "disagrees with TorchRec"),
    (balanced_blocks, "disagrees with TorchRec"),
    (lambda ids, h, w: ids * w // h, "disagrees with TorchRec"),  # proportional: floor(id * w / h)
    # the lab's sizes typed in
    (lambda ids, h, w: torch.div(ids * w, 2**40, rounding_mode="floor"), "disagrees"),  # assumes 40-bit ids
    (lambda ids, h, w: ids // 2**39, "disagrees"),  # 2**40 on 2 ranks
    (lambda ids, h, w: ids // -(-h // 2), "disagrees"),  # world_size ignored
    (lambda ids, h, w: torch.zeros_like(ids), "disagrees"),  # "everything is on rank 0", true only by default
    (lambda ids, h, w: (ids >= h // 2).long(), "disagrees"),  # two ranks only
    (lambda ids, h, w: ids[:1] // -(-h // w), "shape"),
    (lambda ids, h, w: ids // max(1, -(-h // w)) if h > w else ids // 0, "raised"),  # no answer when h < w
    # float division: right on every small size, off by 171 ids per block near 2**63
    (lambda ids, h, w: ids // math.ceil(h / w), "divides in floating point"),
    (lambda ids, h, w: torch.floor(ids / -(-h // w)).long(), "divides in floating point"),
    (lambda ids, h, w: torch.div(ids, int(torch.tensor(h / w).ceil()), rounding_mode="floor"), "disagrees"),  # float32
    # a float result where an int is required
    (lambda ids, h, w: torch.floor(ids / -(-h // w)), "a rank is an integer"),
    (lambda ids, h, w: (ids // -(-h // w)).double(), "a rank is an integer"),
    (lambda ids, h, w: ids >= -(-h // w), "a rank is an integer"),  # bool
    # the range read off the ids instead of the argument: right whenever the largest id is the range's last
    (lambda ids, h, w: ids // -(-(int(ids.max()) + 1) // w), "disagrees"),
])
def test_shard_of_rejects(answer, reason):
    rejects(lab10.check_shard_of, answer, match=reason)


def test_shard_of_says_where_the_ids_go():
    message = rejects(lab10.check_shard_of, balanced_blocks, match="disagrees")
    # 1,000 ids on 3 ranks: TorchRec's blocks are 334, 334, 332; balanced ones 334, 333, 333
    assert "id 667: TorchRec sends it to rank 1, shard_of names rank 2" in message
    assert "would be looked for on a rank whose map does not hold them" in message


# ------------------------------------------------------------------------------------------ exercise 4


def good_info_nce(a, b, t):
    return F.cross_entropy(F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / t, torch.arange(len(a)))


def test_info_nce_passes_the_solution(capsys):
    lab10.check_info_nce(good_info_nce)
    assert capsys.readouterr().out.startswith("✓ info_nce")


def test_the_independent_reference_agrees_with_the_labs():
    from course_lib.coldstart import reference_info_nce

    for a, b, t in lab10._info_nce_cases():
        assert t != 0.1 and len(a) != 512  # the lab's temperature and batch
        assert math.isclose(float(lab10.independent_info_nce(a, b, t)), float(reference_info_nce(a, b, t)), rel_tol=1e-5)
        x, y = a.clone().requires_grad_(), a.clone().requires_grad_()
        lab10.independent_info_nce(x, b, t).backward()
        reference_info_nce(y, b, t).backward()
        assert torch.allclose(x.grad, y.grad, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("answer", [
    lambda a, b, t: (lambda s: (torch.logsumexp(s, 1) - s.diagonal()).mean())(
        F.cosine_similarity(a[:, None], b[None], dim=2) / t),
    lambda a, b, t: -torch.log_softmax(F.normalize(a, dim=1) @ F.normalize(b, dim=1).T / t, dim=1).diagonal().mean(),
])
def test_info_nce_passes_other_right_answers(answer):
    lab10.check_info_nce(answer)


def _sim(a, b):
    return F.normalize(a, dim=1) @ F.normalize(b, dim=1).T


def info_nce_normalizing_in_place(a, b, t):  # the right value, but the caller's embeddings are now unit rows
    a /= a.norm(dim=1, keepdim=True)
    b /= b.norm(dim=1, keepdim=True)
    return F.cross_entropy(a @ b.T / t, torch.arange(len(a)))


def info_nce_through_data(a, b, t):  # .data: no autograd error, the caller's tensor changed all the same
    a.data = F.normalize(a.data, dim=1)
    return good_info_nce(a, b, t)


@pytest.mark.parametrize("answer, reason", [
    (lambda a, b, t: F.cross_entropy(_sim(a, b), torch.arange(len(a))), "ignores the temperature"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) * t, torch.arange(len(a))), "multiplies by the temperature"),
    (lambda a, b, t: good_info_nce(a, b, 0.1), "divides by 0.1, the lab's temperature, not by its argument (0.07)"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b).T / t, torch.arange(len(a))), "transposed similarity"),
    (lambda a, b, t: F.cross_entropy(_sim(b, a) / t, torch.arange(len(a))), "transposed similarity"),
    # a softmax over each column is the transposed loss: the same mistake, the same message
    (lambda a, b, t: -torch.log_softmax(_sim(a, b) / t, dim=0).diagonal().mean(), "transposed similarity"),
    (lambda a, b, t: (F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)))
                      + F.cross_entropy(_sim(a, b).T / t, torch.arange(len(a)))) / 2, "averages both directions"),
    # normalisation left out, one-sided, or along the wrong axis
    (lambda a, b, t: F.cross_entropy(a @ b.T / t, torch.arange(len(a))), "raw dot products"),
    (lambda a, b, t: F.cross_entropy(F.normalize(a, dim=1) @ b.T / t, torch.arange(len(a))), "normalizes id_emb only"),
    (lambda a, b, t: F.cross_entropy(a @ F.normalize(b, dim=1).T / t, torch.arange(len(a))),
     "normalizes content_emb only"),
    (lambda a, b, t: F.cross_entropy(F.normalize(a, dim=0) @ F.normalize(b, dim=0).T / t, torch.arange(len(a))),
     "wrong axis (dim=0)"),
    # sum, not mean
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)), reduction="sum"), "sums over the rows"),
    # labels: reversed, all zero, sized by the lab's batch or by the embedding width
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)).flip(0)), "labels reversed"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.zeros(len(a), dtype=torch.long)), "expected"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(512)), "one label per row of this batch"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(a.shape[1])), "one label per row of this batch"),
    # not a loss
    pytest.param(lambda a, b, t: float(good_info_nce(a, b, t)), "training needs a tensor",
                 marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")),
    (lambda a, b, t: good_info_nce(a, b, t).detach(), "no gradient"),
    (lambda a, b, t: F.cross_entropy(_sim(a, b) / t, torch.arange(len(a)), reduction="none"), "a loss is one number"),
    (lambda a, b, t: F.mse_loss(F.normalize(a, dim=1), F.normalize(b, dim=1)), "expected"),
    (lambda a, b, t: (lambda s: (torch.logsumexp(s.masked_fill(torch.eye(len(a), dtype=torch.bool), float("-inf")), 1)
                                 - s.diagonal()).mean())(_sim(a, b) / t), "expected"),  # the positive left out of the denominator
    # the right value, the wrong gradients
    (lambda a, b, t: good_info_nce(a, b.detach(), t), "no gradient reaches content_emb"),  # content tower never trains
    (lambda a, b, t: good_info_nce(a.detach(), b, t), "no gradient reaches id_emb"),
    pytest.param(lambda a, b, t: torch.tensor(float(good_info_nce(a, b, t)), requires_grad=True), "no gradient reaches",
                 marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")),
    (lambda a, b, t: F.cross_entropy((a / a.norm(dim=1, keepdim=True).detach()) @ (b / b.norm(dim=1, keepdim=True).detach()).T
                                     / t, torch.arange(len(a))), "gradient with respect to id_emb"),  # norms detached
    # the caller's embeddings changed
    (info_nce_normalizing_in_place, "info_nce changed its argument 1 (a torch.float32 tensor"),
    (info_nce_through_data, "info_nce changed its argument 1 (a torch.float32 tensor"),
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
