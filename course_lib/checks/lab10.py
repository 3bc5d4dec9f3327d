"""Checks for 10_new_ids: the collision rate, a table for a memory budget, the rank that owns an id."""
from __future__ import annotations

import math
import statistics
from typing import Any, Callable, Mapping

import torch

from torchrec import KeyedJaggedTensor

from course_lib import collisions, data
from course_lib.checks import CheckFailed, checked_call, exercise, fail, one_line, passed, raise_if_unwritten, same_gradients

# ------------------------------------------------------------------------------------------ exercise 1


def _collision_cases() -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(what the case tests, ids, rows): small hand cases, then a random one the learner has not seen."""
    g = torch.Generator().manual_seed(10)
    ids = torch.randint(0, 2**40, (300,), generator=g)
    ids = ids[torch.randint(0, 300, (1_200,), generator=g)]  # repeats: one id, many impressions
    return [
        ("5 and 7 share row 1, 5 comes twice", torch.tensor([5, 5, 7, 9]), torch.tensor([1, 1, 1, 2])),
        ("no two ids share a row", torch.tensor([3, 8, 3, 8, 3]), torch.tensor([0, 4, 0, 4, 0])),
        ("three ids in one row, two alone", torch.tensor([10, 11, 12, 13, 14, 10]), torch.tensor([0, 0, 0, 1, 2, 0])),
        ("600 impressions of 300 random 40-bit ids, rows = id % 97", ids, ids % 97),
    ]


def _wrong_collision_answers(ids: torch.Tensor, rows: torch.Tensor) -> dict[str, float]:
    """Values that plausible mistakes give, with what each mistake is."""
    pairs = torch.unique(torch.stack([ids, rows]), dim=1)
    _, per_row = torch.unique(pairs[1], return_counts=True)
    _, impressions_per_row = torch.unique(rows, return_counts=True)
    shared_rows = per_row > 1
    return {
        "counted impressions in rows used more than once, not distinct ids (an id seen twice is one id)":
            float((impressions_per_row[impressions_per_row > 1]).sum()) / len(ids),
        "counted only the extra ids in each shared row (every id in a shared row has collided)":
            float((per_row[shared_rows] - 1).sum()) / pairs.shape[1],
        "counted rows, not ids (the rate is a share of ids)": float(shared_rows.float().mean()),
        "counted the impressions whose row is shared, over all impressions": float(
            torch.isin(rows, torch.unique(pairs[1])[shared_rows]).float().mean()),
        "divided by the impressions, not by the distinct ids":
            float(per_row[shared_rows].sum()) / len(ids),
    }


@exercise
def check_shared_row_fraction(shared_row_fraction: Callable[[torch.Tensor, torch.Tensor], Any]) -> None:
    """`shared_row_fraction(ids, rows)`: the share of distinct ids whose row also serves another distinct id.

    The check calls it on hand-made cases and on a random one, and compares with the definition.
    """
    cases = _collision_cases()
    answers = []
    for what, ids, rows in cases:
        try:
            answers.append(float(checked_call("shared_row_fraction", shared_row_fraction, ids.clone(), rows.clone())))
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"shared_row_fraction raised {one_line(error)} on the case '{what}'",
                 "ids[n] landed in rows[n]; torch.unique(torch.stack([ids, rows]), dim=1) gives the distinct pairs")
    wants = [collisions.shared_row_fraction(ids, rows) for _, ids, rows in cases]
    wrong = [i for i, (got, want) in enumerate(zip(answers, wants)) if not math.isclose(got, want, abs_tol=1e-6)]
    if wrong:
        first = wrong[0]
        what, got, want = cases[first][0], answers[first], wants[first]
        mistakes = [_wrong_collision_answers(ids, rows) for _, ids, rows in cases]
        for mistake in mistakes[0]:  # a mistake is named only when it explains every case
            if all(math.isclose(a, m[mistake], abs_tol=1e-6) for a, m in zip(answers, mistakes)):
                fail(f"shared_row_fraction gave {got:.4f} on '{what}', expected {want:.4f}: it {mistake}",
                     "count distinct ids; an id collides when its row also holds a different id")
        fail(f"shared_row_fraction gave {got:.4f} on '{what}', expected {want:.4f}",
             "distinct ids in rows that hold 2 or more distinct ids, divided by all distinct ids")
    passed("shared_row_fraction counts distinct ids in shared rows (4 cases, one of 1,200 random impressions)")


# ------------------------------------------------------------------------------------------ exercise 2

EMBEDDING_DIM = 8
BYTES_PER_ROW = EMBEDDING_DIM * 4  # fp32 weights; a managed-collision table holds more (`held_bytes`)
OPTIONS = ("modulo",) + collisions.EVICTION_POLICIES
TRAIN_BATCH = 512  # the batch `mean_auc` trains with: it sizes the managed-collision modules' history buffers


def table_bytes(rows: int) -> int:
    """Bytes of the weights alone of one table of ``rows`` rows of the lab's width."""
    return rows * BYTES_PER_ROW


def _sparse(rows: int | Mapping[str, int], policy: str) -> torch.nn.Module:
    tables = collisions.id_tables(rows, EMBEDDING_DIM)
    return collisions.hashed_ebc(tables) if policy == "modulo" else collisions.zch_ebc(tables, policy)


_HELD_CACHE: dict[tuple[int, str], int] = {}


def held_bytes(rows: int, policy: str) -> int:
    """Bytes one of the lab's tables holds, measured: its weights plus every buffer of its module.

    The module is built with ``rows`` rows per table and fed one training batch of the size `mean_auc` trains
    with, because a managed-collision module registers its history buffers at its first training batch
    (``MCHManagedCollisionModule._init_history_buffers``); then the bytes of every parameter and buffer
    (numel x element size) are summed, and divided by the number of tables (each feature's table gets the
    same budget).
    """
    key = (rows, policy)
    if key not in _HELD_CACHE:
        module = _sparse(rows, policy).train()
        features = ("user", "item")
        ids = torch.arange(TRAIN_BATCH * len(features), dtype=torch.long)
        module(KeyedJaggedTensor(keys=list(features), values=ids,
                                 lengths=torch.ones(len(ids), dtype=torch.long)))
        total = sum(t.numel() * t.element_size() for t in (*module.parameters(), *module.buffers()))
        _HELD_CACHE[key] = total // len(features)
    return _HELD_CACHE[key]


def bytes_per_row(policy: str) -> tuple[int, int]:
    """(bytes per row, fixed bytes) of one table under ``policy``, measured with `held_bytes` at two sizes."""
    per_row = held_bytes(257, policy) - held_bytes(256, policy)
    return per_row, held_bytes(256, policy) - 256 * per_row


def most_rows(budget_bytes: int, policy: str) -> int:
    """The most rows a table under ``policy`` can have within ``budget_bytes``, every byte counted (0 if none)."""
    per_row, fixed = bytes_per_row(policy)
    return max(0, (budget_bytes - fixed) // per_row)


_EXACT_CACHE: dict[data.DriftConfig, tuple[float, list[float]]] = {}
_AUC_CACHE: dict[tuple[data.DriftConfig, int, str], tuple[float, list[float]]] = {}


def mean_auc(log: data.DriftingLog, rows: int | Mapping[str, int], policy: str) -> tuple[float, list[float]]:
    """Train the lab's model with these tables day by day; return ``(mean AUC over the scored days, [AUC of each
    scored day])``.

    ``policy`` is "modulo" or a managed-collision eviction policy. Seeded: the same choice always gives the
    same figures on one machine.
    """
    torch.manual_seed(0)
    model = collisions.IdClickModel(_sparse(rows, policy), log.config.num_dense, EMBEDDING_DIM)
    days = collisions.run_days(model, log, lr=0.2, batch_size=TRAIN_BATCH)
    aucs = [d.auc for d in days]
    return statistics.mean(aucs), aucs


def _cached_auc(log: data.DriftingLog, rows: int, policy: str) -> tuple[float, list[float]]:
    key = (log.config, rows, policy)  # a config always generates the same log
    if key not in _AUC_CACHE:
        _AUC_CACHE[key] = mean_auc(log, rows, policy)
    return _AUC_CACHE[key]


def exact_mean_auc(log: data.DriftingLog) -> float:
    """Mean AUC with tables that have a row for every id the log ever shows (no eviction, no collision)."""
    key = log.config  # a config always generates the same log
    if key not in _EXACT_CACHE:
        rows = {f: log.vocabulary(f) + 1 for f in ("user", "item")}
        _EXACT_CACHE[key] = mean_auc(log, rows, "lru")
    return _EXACT_CACHE[key][0]


def best_choice(log: data.DriftingLog, budget_bytes: int) -> tuple[str, int, float]:
    """(policy, rows, mean AUC) of the best option within ``budget_bytes``: each policy with as many rows as fit."""
    fitting = [(policy, most_rows(budget_bytes, policy)) for policy in OPTIONS]
    scored = [(policy, rows, _cached_auc(log, rows, policy)[0]) for policy, rows in fitting if rows >= 2]
    return max(scored, key=lambda s: s[2])


def _valid_choice(choice: Any, budget_bytes: int) -> tuple[int, str]:
    """Fail unless ``choice`` (the answer for ``budget_bytes``) is a well-formed ``{"rows", "policy"}``."""
    where = f"for a budget of {budget_bytes:,} bytes"
    if not isinstance(choice, Mapping) or set(choice) != {"rows", "policy"}:
        fail(f"choose_table returned {choice!r} {where}: it must return a dict with the keys 'rows' and 'policy'",
             'for example {"rows": 300, "policy": "lru"}')
    rows, policy = choice["rows"], choice["policy"]
    if not isinstance(rows, int) or isinstance(rows, bool) or rows < 2:
        fail(f"rows must be an int of at least 2, got {rows!r} {where}", "a managed-collision table needs a row for misses")
    if policy not in OPTIONS:
        fail(f"policy must be one of {', '.join(map(repr, OPTIONS))}, got {policy!r}")
    return rows, policy


def _over_budget(rows: int, policy: str, budget_bytes: int, fixed_rows: bool = False) -> None:
    """Fail with what a table of ``rows`` rows under ``policy`` holds, byte for byte, when it exceeds the budget."""
    held = held_bytes(rows, policy)
    if held <= budget_bytes:
        return
    per_row, fixed = bytes_per_row(policy)
    weights = table_bytes(rows)
    what = (f"{rows} rows of {policy}: {held:,} bytes per table ({weights:,} of weights"
            + (f" + {held - weights:,} of its managed-collision module: {per_row - BYTES_PER_ROW} bytes a row and "
               f"{fixed:,} fixed)" if policy != "modulo" else ")")
            + f", {held - budget_bytes:,} bytes over the budget of {budget_bytes:,}")
    fit = most_rows(budget_bytes, policy)
    if fixed_rows:
        hint = "it returns the same rows whatever the budget: compute them from budget_bytes"
    elif policy != "modulo" and held > budget_bytes >= weights:
        hint = ("the weights fit, the module does not: count every byte the table holds, the id map and the "
                "eviction metadata too" + (f" (at most {fit} rows fit)" if fit >= 2 else
                                           f" (no {policy} table fits {budget_bytes:,} bytes)"))
    elif policy == "modulo" and rows == fit + 1:
        hint = (f"round down: {budget_bytes:,} bytes hold {fit} whole rows of {BYTES_PER_ROW} bytes "
                f"(budget_bytes // {BYTES_PER_ROW})")
    else:
        hint = f"at most {fit} rows fit; compute them from budget_bytes" if fit >= 2 else \
            f"no {policy} table fits {budget_bytes:,} bytes"
    fail(what, hint)


def _judge_choice(choice: Any, log: data.DriftingLog, budget_bytes: int, margin: float, fixed_rows: bool) -> str:
    """Fail unless ``choice`` fits ``budget_bytes``, every byte counted, and trains within ``margin`` of the best
    option that fits; say how it did."""
    rows, policy = _valid_choice(choice, budget_bytes)
    _over_budget(rows, policy, budget_bytes, fixed_rows)
    best_policy, best_rows, best = best_choice(log, budget_bytes)
    got, per_day = _cached_auc(log, rows, policy)
    days = ", ".join(f"{a:.3f}" for a in per_day)
    if got < best - margin:
        fit = most_rows(budget_bytes, policy)
        if rows < fit:
            hint = (f"{policy} has room for {fit} rows in {budget_bytes:,} bytes and you gave it {rows}: "
                    "a smaller table collides or evicts more")
        else:
            hint = {
                "modulo": "modulo hashing mixes unrelated ids in every row, whatever the table size",
                "lfu": "plain LFU never forgets old counts: once the table is full, a new id gets a row only if one "
                       "batch brings it more often than the least-counted resident has been seen in all (section 3)",
                "lru": "at this size LRU evicts ids that come back within the day: the table thrashes",
            }.get(policy, "count what each option holds, and what that leaves it in rows")
        fail(f"{policy} with {rows} rows (for a budget of {budget_bytes:,} bytes): mean AUC {got:.4f} (days {days}), "
             f"{best - got:.4f} below {best_policy} with {best_rows} rows, the best that fits ({best:.4f}); "
             f"the margin is {margin}", hint)
    return (f"{budget_bytes:,} bytes: {policy}, {rows} rows ({held_bytes(rows, policy):,} bytes held), "
            f"mean AUC {got:.4f} ({got - best:+.4f} from the best that fits)")


@exercise
def check_table_choice(
    choose_table: Callable[[int], Mapping[str, Any]], log: data.DriftingLog, budget_bytes: int, margin: float
) -> None:
    """`choose_table(budget_bytes)` returns ``{"rows": ..., "policy": ...}``: tables that hold at most
    `budget_bytes` each, every byte counted (`held_bytes`: the weights and every buffer of the module), whose
    mean AUC is within `margin` of the best option that fits.

    The check asks for the lab's budget and for a third more, measures the bytes each answer holds, trains
    the lab's model with it, and compares with each option given as many rows as fit. It also asks for a
    smaller budget that is not a whole number of fp32 rows, and checks only that the table fits it.
    """

    def ask(budget: int) -> Any:
        try:
            return choose_table(budget)
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"choose_table({budget}) raised {one_line(error)}")

    small = budget_bytes * 3 // 4 // BYTES_PER_ROW * BYTES_PER_ROW + BYTES_PER_ROW * 3 // 4  # 288.75 fp32 rows of the lab's
    answers = {budget: ask(budget) for budget in (small, budget_bytes, budget_bytes * 4 // 3)}
    valid = {budget: _valid_choice(choice, budget) for budget, choice in answers.items()}
    fixed_rows = len({rows for rows, _ in valid.values()}) == 1
    _over_budget(*valid[small], small, fixed_rows)
    lines = [_judge_choice(answers[budget], log, budget, margin, fixed_rows)
             for budget in (budget_bytes, budget_bytes * 4 // 3)]
    passed("within the budget, every byte counted, and the margin: " + "; ".join(lines))


# ------------------------------------------------------------------------------------------ exercise 3


def shard_of(ids: torch.Tensor, input_hash_size: int, world_size: int) -> torch.Tensor:
    """The rank whose row-wise shard of a managed-collision table owns each raw id.

    TorchRec cuts the id range ``[0, input_hash_size)`` into ``world_size`` blocks of
    ``ceil(input_hash_size / world_size)`` ids (``RwSparseFeaturesDist``, ``block_bucketize_sparse_features``).
    """
    block = -(-input_hash_size // world_size)
    return torch.div(ids, block, rounding_mode="floor")


def _edges(input_hash_size: int, world_size: int) -> torch.Tensor:
    """The first and last id of every block but the first's first."""
    block = -(-input_hash_size // world_size)
    edges = [i * block + d for i in range(1, world_size) for d in (-1, 0)] + [input_hash_size - 1]
    return torch.tensor(edges, dtype=torch.long)


def _shard_cases() -> list[tuple[torch.Tensor, int, int]]:
    g = torch.Generator().manual_seed(11)
    return [
        (torch.randint(0, 2**40, (64,), generator=g), 2**40, 2),
        (torch.tensor([0, 332, 333, 334, 666, 667, 668, 999]), 1_000, 3),  # 1,000 / 3 does not divide
        # the default: every 40-bit id on rank 0; and ids at the edges of its blocks, where a block computed with
        # float division (53 bits) is 171 ids short
        (torch.cat([torch.randint(0, 2**40, (64,), generator=g), _edges(2**63 - 1, 3)]), 2**63 - 1, 3),
        (torch.tensor([0, 1, 2, 3, 7, 8, 9, 10, 11]), 12, 4),
        (torch.randint(0, 10**6, (100,), generator=g), 10**6, 8),
    ]


@exercise
def check_shard_of(shard_of_answer: Callable[[torch.Tensor, int, int], Any]) -> None:
    """`shard_of(ids, input_hash_size, world_size)`: the rank that owns each id, as TorchRec routes it."""
    for ids, hash_size, world in _shard_cases():
        want = shard_of(ids, hash_size, world)
        try:
            got = torch.as_tensor(checked_call("shard_of", shard_of_answer, ids.clone(), hash_size, world))
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"shard_of raised {one_line(error)} (input_hash_size={hash_size}, world_size={world})")
        case = f"input_hash_size={hash_size:,}, world_size={world}"
        if got.shape != want.shape:
            fail(f"shard_of returned shape {tuple(got.shape)} for {len(ids)} ids ({case})", "one rank per id")
        if torch.equal(got.long(), want):
            continue
        if torch.equal(got.long(), ids % world):
            fail(f"shard_of spreads ids by id % world_size ({case}): that is how a table-row-wise *row* is "
                 "placed in some systems, not how TorchRec routes a managed-collision id",
                 "TorchRec cuts [0, input_hash_size) into world_size contiguous blocks")
        float_block = math.ceil(hash_size / world)
        if float_block != -(-hash_size // world) and (
            torch.equal(got.long(), torch.div(ids, float_block, rounding_mode="floor"))
            or torch.equal(got.long(), torch.floor(ids.double() / -(-hash_size // world)).long())
        ):
            fail(f"shard_of is off at the edges of the blocks ({case}): it divides in floating point (/, math.ceil), "
                 f"and a float keeps 53 bits: near 2**63 the block ceil(input_hash_size / world_size) = "
                 f"{-(-hash_size // world):,} and the ids are rounded", "stay in integers: block = "
                 "-(-input_hash_size // world_size), then torch.div(ids, block, rounding_mode='floor')")
        if torch.equal(got.long(), torch.div(ids, hash_size // world, rounding_mode="floor")):
            fail(f"shard_of divides by input_hash_size // world_size ({case}): with a size that does not divide, "
                 "the last ids land on a rank that does not exist", "the block is ceil(input_hash_size / world_size)")
        if (got < 0).any() or (got >= world).any():
            fail(f"shard_of returned ranks outside 0..{world - 1} ({case})")
        wrong = int((got.long() != want).sum())
        fail(f"shard_of disagrees with TorchRec on {wrong} of {len(ids)} ids ({case})",
             "rank = id // ceil(input_hash_size / world_size)")
    passed("shard_of routes ids as TorchRec's row-wise input distribution does (5 cases, uneven blocks included)")


# ------------------------------------------------------------------------------------------ exercise 4


def _info_nce_mistakes(a: torch.Tensor, b: torch.Tensor, t: float) -> dict[str, torch.Tensor]:
    """What plausible mistakes compute on (a, b, t), with what each mistake is."""
    from torch.nn import functional as F

    na, nb = F.normalize(a, dim=1), F.normalize(b, dim=1)
    labels = torch.arange(len(a))
    sim = na @ nb.T
    return {
        "ignores the temperature (divide the similarities by it)": F.cross_entropy(sim, labels),
        "multiplies by the temperature instead of dividing": F.cross_entropy(sim * t, labels),
        "scores content against ids (a transposed similarity matrix, or a softmax over each column): each id row "
        "must choose among the content rows": F.cross_entropy(sim.T / t, labels),
        "averages both directions: this exercise asks for ids -> content only": (
            F.cross_entropy(sim / t, labels) + F.cross_entropy(sim.T / t, labels)) / 2,
        "uses raw dot products: normalize both sides first (cosine similarity)": F.cross_entropy(a @ b.T / t, labels),
        "normalizes the wrong axis (dim=0): normalize each embedding, that is each row": F.cross_entropy(
            F.normalize(a, dim=0) @ F.normalize(b, dim=0).T / t, labels),
        "sums over the rows instead of averaging": F.cross_entropy(sim / t, labels, reduction="sum"),
        "has the labels reversed: row i's positive is content row i": F.cross_entropy(sim / t, labels.flip(0)),
    }


@exercise
def check_info_nce(info_nce: Callable[[torch.Tensor, torch.Tensor, float], Any]) -> None:
    """`info_nce(id_emb, content_emb, temperature)`: a scalar tensor, InfoNCE from ids to content."""
    from course_lib.coldstart import reference_info_nce

    g = torch.Generator().manual_seed(12)
    cases = [(torch.randn(7, 5, generator=g), torch.randn(7, 5, generator=g), 0.1),
             (torch.randn(12, 8, generator=g) * 3, torch.randn(12, 8, generator=g), 0.5)]
    for a, b, t in cases:
        a_in, b_in = a.clone().requires_grad_(), b.clone().requires_grad_()
        try:
            got = info_nce(a_in, b_in, t)
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"info_nce raised {one_line(error)} on {len(a)} pairs of width {a.shape[1]}")
        if not isinstance(got, torch.Tensor):
            fail(f"info_nce returned a {type(got).__name__}: training needs a tensor to backpropagate through",
                 "return the loss tensor itself, not .item() or float(...)")
        if got.numel() != 1:
            fail(f"info_nce returned shape {tuple(got.shape)}: a loss is one number", "average over the rows")
        if not got.requires_grad:
            fail("info_nce returned a tensor with no gradient: it was detached from the embeddings",
                 "compute it from id_emb and content_emb with torch operations")
        want = reference_info_nce(a, b, t)
        value = float(got.detach())
        if not math.isclose(value, float(want), rel_tol=1e-5, abs_tol=1e-6):
            for mistake, wrong in _info_nce_mistakes(a, b, t).items():
                if math.isclose(value, float(wrong), rel_tol=1e-5, abs_tol=1e-6):
                    fail(f"info_nce gave {value:.4f}, expected {float(want):.4f}: it {mistake}")
            fail(f"info_nce gave {value:.4f} on {len(a)} pairs at temperature {t}, expected {float(want):.4f}",
                 "cosine similarities of every id row with every content row, divided by the temperature; "
                 "cross-entropy of each row against its own index, averaged")
        same_gradients("info_nce", got, {"id_emb": a_in, "content_emb": b_in}, reference_info_nce, (a, b, t),
                        "the alignment loss is what trains both sides: the id rows and the content tower")
    passed("info_nce: cosine similarities / temperature, ids choose among content rows, averaged "
           "(2 fresh cases, gradients flow)")
