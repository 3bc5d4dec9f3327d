"""Checks for 10_new_ids: the collision rate, a table for a memory budget, the rank that owns an id, InfoNCE."""
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
        ("1,200 impressions of 300 random 40-bit ids, rows = id % 97", ids, ids % 97),
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

    The check asks for the lab's budget, for a third more and for a quarter less (a budget that is not a whole
    number of fp32 rows), measures the bytes each answer holds, trains the lab's model with it, and compares
    with each option given as many rows as fit.
    """

    def ask(budget: int) -> Any:
        try:
            return checked_call("choose_table", choose_table, budget)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"choose_table({budget}) raised {one_line(error)}")

    small = budget_bytes * 3 // 4 // BYTES_PER_ROW * BYTES_PER_ROW + BYTES_PER_ROW * 3 // 4  # 288.75 fp32 rows of the lab's
    answers = {budget: ask(budget) for budget in (small, budget_bytes, budget_bytes * 4 // 3)}
    valid = {budget: _valid_choice(choice, budget) for budget, choice in answers.items()}
    fixed_rows = len({rows for rows, _ in valid.values()}) == 1
    _over_budget(*valid[small], small, fixed_rows)
    lines = [_judge_choice(answers[budget], log, budget, margin, fixed_rows)
             for budget in (budget_bytes, budget_bytes * 4 // 3, small)]
    passed("within the budget, every byte counted, and the margin: " + "; ".join(lines))


# ------------------------------------------------------------------------------------------ exercise 3


def shard_of(ids: torch.Tensor, input_hash_size: int, world_size: int) -> torch.Tensor:
    """The rank whose row-wise shard of a managed-collision table owns each raw id in ``[0, input_hash_size)``.

    TorchRec cuts the id range into ``world_size`` blocks of ``ceil(input_hash_size / world_size)`` ids
    (``RwSparseFeaturesDist``); `torchrec_owners` runs TorchRec's own code, and the tests check the two agree.
    """
    block = -(-input_hash_size // world_size)
    return torch.div(ids, block, rounding_mode="floor")


def torchrec_owners(ids: torch.Tensor, input_hash_size: int, world_size: int) -> torch.Tensor:
    """The rank TorchRec's row-wise input distribution sends each id to, computed by TorchRec itself.

    A sharded managed-collision collection builds one ``RwSparseFeaturesDist`` per sharding, with each module's
    ``input_size()`` (its ``input_hash_size``) as the feature's hash size and its ``buckets()`` as the number of
    blocks (``ShardedManagedCollisionCollection._create_input_dists`` in ``torchrec/distributed/mc_modules.py``);
    its constructor computes the block size and its forward bucketizes the ids with
    ``bucketize_kjt_before_all2all`` (fbgemm's ``block_bucketize_sparse_features``) before the all-to-all.
    Here the same constructor runs on a fake process group of ``world_size`` ranks (it only asks the group its
    size), and the same bucketization runs on one feature with one id per sample: the bucket an id's sample
    gets its length in is the rank the id is sent to.
    """
    from torch._C._distributed_c10d import FakeProcessGroup
    from torchrec.distributed.embedding_sharding import bucketize_kjt_before_all2all
    from torchrec.distributed.sharding.rw_sharding import RwSparseFeaturesDist

    # as ShardedManagedCollisionCollection._create_input_dists builds it: the hash size is the module's input_size(),
    # the buckets its buckets(), which a row-wise shard's rebuilt module sets to the number of shards, world_size
    dist = RwSparseFeaturesDist(FakeProcessGroup._create_internal(0, world_size), num_features=1,
                                feature_hash_sizes=[input_hash_size], feature_total_num_buckets=[world_size],
                                is_sequence=True, keep_original_indices=True)
    ids = ids.to(torch.long)
    kjt = KeyedJaggedTensor(keys=["f"], values=ids, lengths=torch.ones(len(ids), dtype=torch.long))
    buckets, _ = bucketize_kjt_before_all2all(  # the arguments RwSparseFeaturesDist.forward passes
        kjt, num_buckets=world_size, block_sizes=dist._feature_block_sizes_tensor,
        total_num_blocks=dist._feature_total_num_blocks_tensor, output_permute=True, keep_original_indices=True)
    per_rank = buckets.lengths().view(world_size, len(ids))  # bucket-major: rank r's lengths, one per sample
    assert bool((per_rank.sum(0) == 1).all()), "each id goes to exactly one rank"
    return per_rank.argmax(0)


def _edges(input_hash_size: int, world_size: int) -> torch.Tensor:
    """0, the last id, and the last and first id of every block boundary inside the range."""
    block = -(-input_hash_size // world_size)
    edges = {0, input_hash_size - 1} | {i * block + d for i in range(1, world_size) for d in (-1, 0)}
    return torch.tensor(sorted(e for e in edges if 0 <= e < input_hash_size), dtype=torch.long)


def _shard_cases() -> list[tuple[str, torch.Tensor, int, int]]:
    """(what the case tests, ids, input_hash_size, world_size): none is a size the lab shows."""
    g = torch.Generator().manual_seed(11)

    def ids(high: int, n: int, hash_size: int, world: int) -> torch.Tensor:
        return torch.cat([torch.randint(0, high, (n,), generator=g), _edges(hash_size, world)])

    return [
        ("3 does not divide 1,000", ids(1_000, 40, 1_000, 3), 1_000, 3),
        ("4 does not divide 10", ids(10, 6, 10, 4), 10, 4),
        ("9 ids on 4 ranks: the last rank owns none", torch.arange(9), 9, 4),
        ("input_hash_size smaller than world_size", torch.arange(3), 3, 5),
        ("8 divides 1,000,000", ids(10**6, 100, 10**6, 8), 10**6, 8),
        ("one rank", ids(50, 10, 50, 1), 50, 1),
        ("40-bit ids, a range of 2**40 - 5 on 7 ranks", ids(2**40 - 5, 64, 2**40 - 5, 7), 2**40 - 5, 7),
        # the module's default: 40-bit ids all on rank 0; and ids at the edges of its blocks, where a block
        # computed in floating point (53 bits) is 171 ids short
        ("the default input_hash_size, 2**63 - 1, on 3 ranks", ids(2**40, 64, 2**63 - 1, 3), 2**63 - 1, 3),
        # ids that stop well short of the range: the range is the argument, not what the ids span
        ("ids below 400 of a range of 1,000 on 3 ranks", torch.arange(0, 400, 7), 1_000, 3),
    ]


@exercise
def check_shard_of(shard_of_answer: Callable[[torch.Tensor, int, int], Any]) -> None:
    """`shard_of(ids, input_hash_size, world_size)`: the rank TorchRec's row-wise input distribution sends each
    id of ``[0, input_hash_size)`` to, as an integer tensor, the caller's ids left as they were.

    The check calls it on sizes the lab does not show (world sizes that do not divide the range, a range
    smaller than the world, block edges, the 63-bit default) and compares with TorchRec's own bucketization
    (`torchrec_owners`).
    """
    cases = _shard_cases()
    for what, ids, hash_size, world in cases:
        case = f"input_hash_size={hash_size:,}, world_size={world}: {what}"
        want = torchrec_owners(ids, hash_size, world)
        try:
            got = torch.as_tensor(checked_call("shard_of", shard_of_answer, ids.clone(), hash_size, world))
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"shard_of raised {one_line(error)} ({case})",
                 "it must work for any input_hash_size and world_size, including a range smaller than the world")
        if got.shape != want.shape:
            fail(f"shard_of returned shape {tuple(got.shape)} for {len(ids)} ids ({case})", "one rank per id")
        if got.dtype.is_floating_point or got.dtype.is_complex or got.dtype == torch.bool:
            fail(f"shard_of returned a {got.dtype} tensor ({case}): a rank is an integer; a float one cannot index "
                 "a list of shards and stops being exact above 2**53, a bool one names ranks 0 and 1 only",
                 "stay in integers: // or torch.div(..., rounding_mode='floor') on int64 ids gives int64")
        if torch.equal(got.long(), want):
            continue
        loads = lambda owners: torch.bincount(owners.clamp(0, world - 1), minlength=world).tolist()  # noqa: E731
        first = int((got.long() != want).nonzero()[0])
        consequence = (f"{int((got.long() != want).sum())} of {len(ids)} ids would be looked for on a rank whose map "
                       f"does not hold them (id {int(ids[first]):,}: TorchRec sends it to rank {int(want[first])}, "
                       f"shard_of names rank {int(got[first])}); ids per rank, TorchRec {loads(want)}")
        if torch.equal(got.long(), ids % world):
            fail(f"shard_of spreads ids by id % world_size ({case}): TorchRec sends contiguous blocks of the id "
                 f"range, not every world_size-th id; {consequence}",
                 "each rank owns one contiguous block of [0, input_hash_size)")
        block = -(-hash_size // world)
        in_floats = (torch.div(ids, math.ceil(hash_size / world), rounding_mode="floor"),  # math.ceil(h / w): 53 bits
                     torch.floor(ids.double() / block).long(),  # ids / block in float64
                     torch.floor(ids / block).long())  # ids / block as torch divides ints: float32, 24 bits
        if any(torch.equal(got.long(), owners) for owners in in_floats):
            fail(f"shard_of is off at the edges of the blocks ({case}): it divides in floating point (/, math.ceil), "
                 "and a float keeps 53 bits (float64) or 24 (float32, what torch's / gives on int64 tensors): ids and "
                 f"blocks of this size are rounded; {consequence}",
                 "stay in integers: no / and no math.ceil on the sizes or the ids")
        if hash_size // world and torch.equal(got.long(), torch.div(ids, hash_size // world, rounding_mode="floor")):
            fail(f"shard_of divides by input_hash_size // world_size ({case}): right only when world_size divides "
                 f"the range; here the last ids land on a rank that does not exist; {consequence}",
                 "TorchRec's blocks are as large as needed for world_size of them to cover the whole range")
        if (got < 0).any() or (got >= world).any():
            fail(f"shard_of returned ranks outside 0..{world - 1} ({case}): {consequence}",
                 "the last block may be shorter, or empty, but every id in [0, input_hash_size) has a rank")
        fail(f"shard_of disagrees with TorchRec's input distribution ({case}): {consequence}, "
             f"shard_of {loads(got.long())}",
             "TorchRec gives every rank a block of the same size, the smallest for which world_size blocks cover "
             "[0, input_hash_size), so the last ranks may own fewer ids or none (RwSparseFeaturesDist in "
             "torchrec/distributed/sharding/rw_sharding.py)")
    passed(f"shard_of sends every id where TorchRec's row-wise input distribution does ({len(cases)} cases: "
           "uneven blocks, a range smaller than the world, block edges, ids short of the range, the 63-bit default)")


# ------------------------------------------------------------------------------------------ exercise 4


def independent_info_nce(id_emb: torch.Tensor, content_emb: torch.Tensor, temperature: float) -> torch.Tensor:
    """InfoNCE from ids to content, written apart from the lab's (and from ``coldstart.reference_info_nce``):
    in float64, each row divided by its norm, and row i's loss the log-sum-exp of its scaled similarities minus
    its positive's; averaged over the rows."""
    a, b = id_emb.double(), content_emb.double()
    similarity = (a / a.norm(dim=1, keepdim=True)) @ (b / b.norm(dim=1, keepdim=True)).T / temperature
    return (torch.logsumexp(similarity, dim=1) - similarity.diagonal()).mean()


def _info_nce_mistakes(a: torch.Tensor, b: torch.Tensor, t: float) -> dict[str, torch.Tensor]:
    """What plausible mistakes compute on (a, b, t), with what each mistake is."""
    from torch.nn import functional as F

    na, nb = F.normalize(a, dim=1), F.normalize(b, dim=1)
    labels = torch.arange(len(a))
    sim = na @ nb.T
    return {
        "ignores the temperature (divide the similarities by it)": F.cross_entropy(sim, labels),
        "multiplies by the temperature instead of dividing": F.cross_entropy(sim * t, labels),
        f"divides by 0.1, the lab's temperature, not by its argument ({t})": F.cross_entropy(sim / 0.1, labels),
        "scores content against ids (a transposed similarity matrix, or a softmax over each column): each id row "
        "must choose among the content rows": F.cross_entropy(sim.T / t, labels),
        "averages both directions: this exercise asks for ids -> content only": (
            F.cross_entropy(sim / t, labels) + F.cross_entropy(sim.T / t, labels)) / 2,
        "uses raw dot products: the similarity must not depend on the embeddings' lengths (unit rows)":
            F.cross_entropy(a @ b.T / t, labels),
        "normalizes id_emb only: the content rows' lengths still scale the similarities": F.cross_entropy(
            na @ b.T / t, labels),
        "normalizes content_emb only: the id rows' lengths still scale the similarities": F.cross_entropy(
            a @ nb.T / t, labels),
        "normalizes the wrong axis (dim=0): normalize each embedding, that is each row": F.cross_entropy(
            F.normalize(a, dim=0) @ F.normalize(b, dim=0).T / t, labels),
        "sums over the rows instead of averaging: the loss would grow with the batch": F.cross_entropy(
            sim / t, labels, reduction="sum"),
        "has the labels reversed: row i's positive is content row i": F.cross_entropy(sim / t, labels.flip(0)),
    }


def _info_nce_cases() -> list[tuple[torch.Tensor, torch.Tensor, float]]:
    """Batches, widths and temperatures the lab does not show (its runs use 0.1); rows of unequal lengths."""
    g = torch.Generator().manual_seed(12)
    return [
        (torch.randn(6, 3, generator=g) * 3, torch.randn(6, 3, generator=g), 0.07),   # more pairs than dimensions
        (torch.randn(3, 16, generator=g), torch.randn(3, 16, generator=g) * 0.2, 0.5),  # fewer
        (torch.randn(11, 8, generator=g) * torch.rand(11, 1, generator=g) * 4, torch.randn(11, 8, generator=g), 2.0),
        (torch.randn(40, 8, generator=g), torch.randn(40, 8, generator=g) * 2, 0.2),
    ]


@exercise
def check_info_nce(info_nce: Callable[[torch.Tensor, torch.Tensor, float], Any]) -> None:
    """`info_nce(id_emb, content_emb, temperature)`: a scalar tensor, InfoNCE from ids to content with in-batch
    negatives, on cosine similarities divided by the temperature, averaged over the rows.

    The check calls it on batch sizes, widths and temperatures the lab does not show, with inputs that come out of
    an autograd graph as a model's do; compares the value with an independent float64 reference
    (`independent_info_nce`) and the gradients reaching both inputs with the reference's; and fails an answer
    that changes the tensors it was handed.
    """
    cases = _info_nce_cases()
    for a, b, t in cases:
        where = f"{len(a)} pairs of width {a.shape[1]}, temperature {t}"
        a_leaf, b_leaf = a.clone().requires_grad_(), b.clone().requires_grad_()
        a_in, b_in = a_leaf * 1.0, b_leaf * 1.0  # not leaves: what a model's embeddings are
        try:
            got = checked_call("info_nce", info_nce, a_in, b_in, t)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"info_nce raised {one_line(error)} on {where}",
                 "row i's positive is content row i: one label per row of this batch, len(id_emb), whatever the "
                 "size of the lab's batches or the width of the embeddings")
        if not isinstance(got, torch.Tensor):
            fail(f"info_nce returned a {type(got).__name__}: training needs a tensor to backpropagate through",
                 "return the loss tensor itself, not .item() or float(...)")
        if got.numel() != 1:
            fail(f"info_nce returned shape {tuple(got.shape)} on {where}: a loss is one number", "average over the rows")
        if not got.requires_grad:
            fail("info_nce returned a tensor with no gradient: it was detached from the embeddings",
                 "compute it from id_emb and content_emb with torch operations")
        want = float(independent_info_nce(a, b, t))
        value = float(got.detach())
        if not math.isclose(value, want, rel_tol=1e-5, abs_tol=1e-6):
            for mistake, wrong in _info_nce_mistakes(a, b, t).items():
                if math.isclose(value, float(wrong), rel_tol=1e-5, abs_tol=1e-6):
                    fail(f"info_nce gave {value:.4f} on {where}, expected {want:.4f}: it {mistake}")
            fail(f"info_nce gave {value:.4f} on {where}, expected {want:.4f}",
                 "id row i against every content row of the batch, its positive content row i; cosine similarities "
                 "divided by the temperature (this argument, not a value typed in); the mean over the rows of the "
                 "negative log softmax probability of each row's positive")
        same_gradients("info_nce", got, {"id_emb": a_leaf, "content_emb": b_leaf}, independent_info_nce, (a, b, t),
                       "the alignment loss is what trains both sides: the id rows and the content tower")
    passed(f"info_nce: ids choose among the batch's content rows, cosine similarities / temperature, averaged "
           f"({len(cases)} fresh cases: batches of 3 to 40, widths 3 to 16, temperatures 0.07 to 2; gradients match)")
