"""Synthetic click logs with a planted ground truth, so the best possible AUC is known exactly.

    log = data.make_click_log(data.ClickLogConfig())       # seeded, deterministic
    log.test                                               # a ClickSplit: counts, dense, ids, labels, true logits
    data.bayes_optimal_auc(log.test)                       # AUC of the true click probabilities on these labels
    data.bayes_optimal_ne(log.test)                        # ... and their normalized entropy
    for batch in data.batches(log.train, 512, rank, world_size):   # torchrec Batch objects, this rank's share
        ...
    data.write_criteo_tsv(log.test, "test.tsv")            # the Criteo TSV layout ...
    data.read_criteo_tsv("test.tsv", log)                  # ... read back with torchrec.datasets.criteo

The world: users and items have latent factors and biases, items have a category, each impression has a
few query terms (a multi-hot feature, 0 to `max_terms` ids) and a few integer counts (dense features).
The click logit of an impression is

    bias + user_bias[u] + item_bias[i] + category_bias[c]
         + <user_factor[u], item_factor[i]> + <sum of term_factor[t] for t in terms, item_factor[i]>
         + sum_j dense_weight[j] * (log1p(count_j) - its mean)

and the label is ``Bernoulli(sigmoid(logit))``. Every term is a dot product of pooled embeddings or a
function of one feature, the shape of interaction that torchrec's DLRM computes, so a DLRM can learn it.
Because the true logits are known, the AUC of the Bayes-optimal predictor (which ranks impressions by
their true click probability) is computed exactly on each split: no model can expect to do better on the
same labels, and the gap to it is what is left to learn.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping

import torch

from course_lib.metrics import normalized_entropy

__all__ = [
    "CRITEO_CAT_COLUMNS",
    "CRITEO_INT_COLUMNS",
    "ClickLog",
    "ClickLogConfig",
    "ClickSplit",
    "DriftConfig",
    "DriftingLog",
    "GroundTruth",
    "Histories",
    "HistoryConfig",
    "SPARSE_FEATURES",
    "auc",
    "batches",
    "bayes_optimal_auc",
    "bayes_optimal_ne",
    "make_click_log",
    "make_drifting_log",
    "make_histories",
    "read_criteo_tsv",
    "recall_ceiling",
    "write_criteo_tsv",
]

CRITEO_INT_COLUMNS = 13  # the Criteo layout: label, 13 integer columns, 26 hashed categorical columns
CRITEO_CAT_COLUMNS = 26
SPARSE_FEATURES = ("user", "item", "category", "terms")


@dataclass(frozen=True)
class ClickLogConfig:
    """Sizes and signal strengths of a synthetic click log.

    The scales are standard deviations of each term's contribution to the true logit; `base_logit` sets
    the overall click rate (about 0.3 with the defaults). The defaults give every user about 600 training
    impressions and every item about 1500: enough for torchrec's DLRM to come within 0.01-0.015 of the
    Bayes-optimal test AUC in three epochs (seeds 0-2). With thousands of users and items in the same
    number of rows, each id's factors rest on far fewer impressions and the gap grows for any model, even
    one with the true functional form.
    """

    num_users: int = 500
    num_items: int = 200
    num_categories: int = 20
    num_terms: int = 50
    num_dense: int = 4
    max_terms: int = 3
    latent_dim: int = 4
    num_train: int = 300_000
    num_test: int = 20_000
    popularity_skew: float = 0.6  # Zipf exponent of user and item popularity (0: uniform)
    base_logit: float = -1.2
    bias_scale: float = 0.6
    category_scale: float = 0.5
    interaction_scale: float = 0.8
    terms_scale: float = 0.5
    dense_scale: float = 0.4
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.num_dense <= CRITEO_INT_COLUMNS:
            raise ValueError(f"num_dense must be 1..{CRITEO_INT_COLUMNS} (the Criteo integer columns)")
        if not 1 <= self.max_terms <= CRITEO_CAT_COLUMNS - 3:
            raise ValueError(f"max_terms must be 1..{CRITEO_CAT_COLUMNS - 3} (user, item, category take 3 columns)")
        for name in ("num_users", "num_items", "num_categories", "num_terms", "latent_dim", "num_train", "num_test"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")

    @property
    def num_embeddings(self) -> dict[str, int]:
        """Rows each sparse feature's table needs: {"user": num_users, ...}."""
        return {"user": self.num_users, "item": self.num_items, "category": self.num_categories, "terms": self.num_terms}

    def tables(self, embedding_dim: int = 16) -> list["EmbeddingBagConfig"]:  # noqa: F821
        """One EmbeddingBagConfig per sparse feature ("t_user", "t_item", ...), all `embedding_dim` wide."""
        from torchrec import EmbeddingBagConfig

        return [
            EmbeddingBagConfig(name=f"t_{name}", embedding_dim=embedding_dim, num_embeddings=rows, feature_names=[name])
            for name, rows in self.num_embeddings.items()
        ]


@dataclass
class ClickSplit:
    """Impressions of one split, column by column (row n is impression n).

    counts: ``[N, num_dense]`` int64, the raw integer features (what a log records).
    ids: per sparse feature, ``(values, lengths)``: the ids of all rows, flat, and how many belong to each
        row (``lengths`` is ``[N]``; "user", "item", "category" have exactly one id per row).
    labels: ``[N]`` int64, 1 for a click.
    true_logits: ``[N]`` float32, the ground truth the labels were drawn from.
    """

    counts: torch.Tensor
    ids: dict[str, tuple[torch.Tensor, torch.Tensor]]
    labels: torch.Tensor
    true_logits: torch.Tensor
    _offsets: dict[str, torch.Tensor] = field(default_factory=dict, repr=False, compare=False)

    def __len__(self) -> int:
        return int(self.labels.numel())

    def __repr__(self) -> str:
        lengths = ", ".join(f"{k}: {int(v.numel())} ids" for k, (v, _) in self.ids.items())
        return (
            f"ClickSplit({len(self)} rows, click rate {self.labels.float().mean().item():.3f}, "
            f"{self.counts.shape[1]} dense counts, sparse {{{lengths}}})"
        )

    @property
    def dense(self) -> torch.Tensor:
        """``[N, num_dense]`` float32 model input: log1p of the counts."""
        return torch.log1p(self.counts.float())

    def offsets(self, feature: str) -> torch.Tensor:
        """``[N + 1]`` start of each row's ids in the feature's flat values."""
        if feature not in self._offsets:
            lengths = self.ids[feature][1]
            self._offsets[feature] = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
        return self._offsets[feature]

    def rows(self, start: int, stop: int) -> "ClickSplit":
        """Rows ``start:stop`` as a new split."""
        ids = {}
        for feature, (values, lengths) in self.ids.items():
            offsets = self.offsets(feature)
            ids[feature] = (values[offsets[start] : offsets[stop]], lengths[start:stop])
        return ClickSplit(self.counts[start:stop], ids, self.labels[start:stop], self.true_logits[start:stop])

    def kjt(self, start: int = 0, stop: int | None = None) -> "KeyedJaggedTensor":  # noqa: F821
        """The sparse features of rows ``start:stop`` as a KeyedJaggedTensor (keys in SPARSE_FEATURES order)."""
        from torchrec import KeyedJaggedTensor

        stop = len(self) if stop is None else stop
        part = self.rows(start, stop)
        keys = list(part.ids)
        return KeyedJaggedTensor(
            keys=keys,
            values=torch.cat([part.ids[k][0] for k in keys]),
            lengths=torch.cat([part.ids[k][1] for k in keys]),
            stride=stop - start,
        )

    def batch(self, start: int = 0, stop: int | None = None) -> "Batch":  # noqa: F821
        """Rows ``start:stop`` as a ``torchrec.datasets.utils.Batch`` (dense, sparse KJT, labels)."""
        from torchrec.datasets.utils import Batch

        stop = len(self) if stop is None else stop
        return Batch(
            dense_features=self.dense[start:stop],
            sparse_features=self.kjt(start, stop),
            labels=self.labels[start:stop],
        )


@dataclass
class GroundTruth:
    """The planted parameters of the world; ``logits(counts, ids)`` recomputes true logits from features."""

    base_logit: float
    user_bias: torch.Tensor
    item_bias: torch.Tensor
    category_bias: torch.Tensor
    user_factors: torch.Tensor
    item_factors: torch.Tensor
    term_factors: torch.Tensor
    dense_weights: torch.Tensor
    dense_center: torch.Tensor
    item_category: torch.Tensor

    def logits(self, counts: torch.Tensor, ids: Mapping[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """True logits ``[N]`` of impressions given their features."""
        user, item, category = (ids[name][0] for name in ("user", "item", "category"))
        term_values, term_lengths = ids["terms"]
        rows = torch.repeat_interleave(torch.arange(term_lengths.numel()), term_lengths)
        pooled_terms = torch.zeros(term_lengths.numel(), self.term_factors.shape[1])
        pooled_terms.index_add_(0, rows, self.term_factors[term_values])
        item_factor = self.item_factors[item]
        logit = (
            self.base_logit
            + self.user_bias[user]
            + self.item_bias[item]
            + self.category_bias[category]
            + (self.user_factors[user] * item_factor).sum(1)
            + (pooled_terms * item_factor).sum(1)
            + (torch.log1p(counts.float()) - self.dense_center) @ self.dense_weights
        )
        return logit.float()


@dataclass
class ClickLog:
    """A generated click log: its config, its ground truth, and a train and a test split."""

    config: ClickLogConfig
    truth: GroundTruth
    train: ClickSplit
    test: ClickSplit

    def __repr__(self) -> str:
        return f"ClickLog(train={self.train!r},\n         test={self.test!r})"

    def tables(self, embedding_dim: int = 16) -> list["EmbeddingBagConfig"]:  # noqa: F821
        """The log's tables: ``config.tables(embedding_dim)``."""
        return self.config.tables(embedding_dim)


def _popularity(n: int, skew: float, generator: torch.Generator) -> torch.Tensor:
    """Sampling weights ~ 1/(rank+1)^skew, assigned to ids in a random order."""
    weights = 1.0 / torch.arange(1, n + 1, dtype=torch.float64) ** skew
    return weights[torch.randperm(n, generator=generator)]


def _ground_truth(config: ClickLogConfig, g: torch.Generator) -> GroundTruth:
    k = config.latent_dim

    def normal(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    # <u, v> of two vectors with iid N(0, s^2) entries has std s^2 * sqrt(k): pick s for the wanted scale.
    factor_std = math.sqrt(config.interaction_scale / math.sqrt(k))
    # terms: up to max_terms term vectors pooled (sum), dotted with an item factor
    mean_terms = max(config.max_terms / 2, 1.0)
    term_std = config.terms_scale / (factor_std * math.sqrt(k * mean_terms))
    return GroundTruth(
        base_logit=config.base_logit,
        user_bias=normal(config.num_users, std=config.bias_scale),
        item_bias=normal(config.num_items, std=config.bias_scale),
        category_bias=normal(config.num_categories, std=config.category_scale),
        user_factors=normal(config.num_users, k, std=factor_std),
        item_factors=normal(config.num_items, k, std=factor_std),
        term_factors=normal(config.num_terms, k, std=term_std),
        dense_weights=normal(config.num_dense, std=config.dense_scale),
        # the mean of log1p(count), so that the dense term averages 0 and base_logit sets the click rate
        dense_center=torch.log1p(_counts(100_000, config.num_dense, g).float()).mean(0),
        item_category=torch.randint(0, config.num_categories, (config.num_items,), generator=g),
    )


def _counts(n: int, num_dense: int, g: torch.Generator) -> torch.Tensor:
    """Integer counts, like "clicks in the last 7 days": Poisson with a log-normal rate (about 1 in 5 is 0)."""
    rates = torch.exp(torch.randn(n, num_dense, generator=g) * 0.8 + 0.8)
    return torch.poisson(rates, generator=g).long()


def _impressions(
    config: ClickLogConfig, truth: GroundTruth, n: int, g: torch.Generator, user_pop: torch.Tensor, item_pop: torch.Tensor
) -> ClickSplit:
    user = torch.multinomial(user_pop, n, replacement=True, generator=g)
    item = torch.multinomial(item_pop, n, replacement=True, generator=g)
    category = truth.item_category[item]
    term_lengths = torch.randint(0, config.max_terms + 1, (n,), generator=g)
    term_values = torch.randint(0, config.num_terms, (int(term_lengths.sum()),), generator=g)
    counts = _counts(n, config.num_dense, g)
    one = torch.ones(n, dtype=torch.long)
    ids = {"user": (user, one), "item": (item, one.clone()), "category": (category, one.clone()),
           "terms": (term_values, term_lengths)}
    true_logits = truth.logits(counts, ids)
    labels = torch.bernoulli(torch.sigmoid(true_logits.double()), generator=g).long()
    return ClickSplit(counts=counts, ids=ids, labels=labels, true_logits=true_logits)


def make_click_log(config: ClickLogConfig | None = None) -> ClickLog:
    """Generate the click log described by `config` (the same config always gives the same log)."""
    config = config or ClickLogConfig()
    g = torch.Generator().manual_seed(config.seed)
    truth = _ground_truth(config, g)
    user_pop = _popularity(config.num_users, config.popularity_skew, g)
    item_pop = _popularity(config.num_items, config.popularity_skew, g)
    train = _impressions(config, truth, config.num_train, g, user_pop, item_pop)
    test = _impressions(config, truth, config.num_test, g, user_pop, item_pop)
    return ClickLog(config=config, truth=truth, train=train, test=test)


# ------------------------------------------------------------------------------------------------ AUC


def auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Exact area under the ROC curve: the chance that a random click scores above a random non-click
    (ties count one half), by the rank-sum (Mann-Whitney) formula. Any monotone transform of the scores
    (logits or probabilities) gives the same AUC."""
    scores = scores.detach().flatten().double()
    labels = labels.detach().flatten().bool()
    positives = int(labels.sum())
    negatives = labels.numel() - positives
    if positives == 0 or negatives == 0:
        raise ValueError("AUC needs at least one click and one non-click")
    order = torch.argsort(scores)
    sorted_scores = scores[order]
    # average rank (1-based) of each group of tied scores
    _, inverse, tie_counts = torch.unique_consecutive(sorted_scores, return_inverse=True, return_counts=True)
    ends = torch.cumsum(tie_counts, 0).double()
    average_rank = (ends - (tie_counts.double() - 1) / 2)[inverse]
    positive_rank_sum = average_rank[labels[order]].sum().item()
    return (positive_rank_sum - positives * (positives + 1) / 2) / (positives * negatives)


def bayes_optimal_auc(split: ClickSplit) -> float:
    """AUC of the Bayes-optimal predictor on this split: its true logits scored against its labels."""
    return auc(split.true_logits, split.labels)


def bayes_optimal_ne(split: ClickSplit) -> float:
    """Normalized entropy of the Bayes-optimal predictor on this split: the cross-entropy of the true click
    probabilities on its labels over the entropy of its click rate (``metrics.normalized_entropy``). No model
    can expect a lower NE on the same labels; a model's NE minus this is what is left to learn."""
    return normalized_entropy(split.true_logits, split.labels)


# -------------------------------------------------------------------------------------------- batches


def batches(
    split: ClickSplit, batch_size: int, rank: int = 0, world_size: int = 1, drop_last: bool = True
) -> Iterator["Batch"]:  # noqa: F821
    """This rank's batches of `split`, as ``torchrec.datasets.utils.Batch`` (what TrainPipelineSparseDist eats).

    Consecutive groups of ``world_size * batch_size`` rows form one global step; rank r takes the r-th
    `batch_size` rows of each. Every rank gets the same number of batches, as sharded models need (each
    forward is a collective). `drop_last=False` also spreads the rows left over at the end across the ranks
    in one last batch each (sizes differ by at most one, and may be 0), so every row is on exactly one rank.
    """
    if batch_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need batch_size >= 1 and 0 <= rank < world_size, got {batch_size}, {rank}, {world_size}")
    step_rows = batch_size * world_size
    full_steps = len(split) // step_rows
    for step in range(full_steps):
        start = step * step_rows + rank * batch_size
        yield split.batch(start, start + batch_size)
    tail = len(split) - full_steps * step_rows
    if not drop_last and tail > 0:
        sizes = [tail // world_size + (1 if r < tail % world_size else 0) for r in range(world_size)]
        start = full_steps * step_rows + sum(sizes[:rank])
        yield split.batch(start, start + sizes[rank])


# ------------------------------------------------------------------------------------ the Criteo layout


def _criteo_columns(max_terms: int) -> dict[str, list[int]]:
    """Which Criteo categorical columns hold which feature: user, item, category, then the terms' slots."""
    return {"user": [0], "item": [1], "category": [2], "terms": list(range(3, 3 + max_terms))}


def write_criteo_tsv(split: ClickSplit, path: str | os.PathLike[str]) -> Path:
    """Write `split` in the Criteo TSV layout: label, 13 integer columns, 26 hex categorical columns.

    The counts fill the first integer columns; user, item and category ids fill categorical columns 0-2
    and each query term one of the next `max_terms` columns (as 8 hex digits, the way Criteo writes its
    hashed values). Unused columns are empty, which is how Criteo marks a missing value.
    """
    if split.counts.shape[1] > CRITEO_INT_COLUMNS:
        raise ValueError(f"the Criteo layout has {CRITEO_INT_COLUMNS} integer columns, the split has {split.counts.shape[1]}")
    columns = _criteo_columns(_max_terms(split))
    path = Path(path)
    counts = split.counts.tolist()
    labels = split.labels.tolist()
    per_row: dict[str, list[list[int]]] = {}
    for feature, (values, lengths) in split.ids.items():
        per_row[feature] = [chunk.tolist() for chunk in torch.split(values, lengths.tolist())]
    with open(path, "w", encoding="utf-8") as f:
        for n in range(len(split)):
            ints = [str(c) for c in counts[n]] + [""] * (CRITEO_INT_COLUMNS - len(counts[n]))
            cats = [""] * CRITEO_CAT_COLUMNS
            for feature, slots in columns.items():
                row_ids = per_row[feature][n]
                for slot, value in zip(slots, row_ids):
                    cats[slot] = f"{value:08x}"
            f.write("\t".join([str(labels[n]), *ints, *cats]) + "\n")
    return path


def _max_terms(split: ClickSplit) -> int:
    lengths = split.ids["terms"][1]
    most = int(lengths.max()) if lengths.numel() else 0
    if most > CRITEO_CAT_COLUMNS - 3:
        raise ValueError(f"a row has {most} terms; the Criteo layout has room for {CRITEO_CAT_COLUMNS - 3}")
    return most


def read_criteo_tsv(path: str | os.PathLike[str], log: ClickLog) -> ClickSplit:
    """Read a file written by :func:`write_criteo_tsv` with torchrec's Criteo reader
    (``torchrec.datasets.criteo.criteo_kaggle``, the TSV DataPipe behind torchrec's Criteo datasets) and
    rebuild the split; its true logits are recomputed from the features with ``log.truth``."""
    from torchrec.datasets.criteo import DEFAULT_CAT_NAMES, DEFAULT_INT_NAMES, criteo_kaggle

    config = log.config
    columns = _criteo_columns(config.max_terms)
    labels, counts = [], []
    values: dict[str, list[int]] = {feature: [] for feature in columns}
    lengths: dict[str, list[int]] = {feature: [] for feature in columns}
    for row in criteo_kaggle(os.fspath(path)):
        labels.append(row["label"])
        counts.append([row[name] for name in DEFAULT_INT_NAMES[: config.num_dense]])
        for feature, slots in columns.items():
            present = [int(row[DEFAULT_CAT_NAMES[s]], 16) for s in slots if row[DEFAULT_CAT_NAMES[s]] != ""]
            values[feature].extend(present)
            lengths[feature].append(len(present))
    ids = {
        feature: (torch.tensor(values[feature], dtype=torch.long), torch.tensor(lengths[feature], dtype=torch.long))
        for feature in columns
    }
    counts_t = torch.tensor(counts, dtype=torch.long).reshape(len(labels), config.num_dense)
    return ClickSplit(
        counts=counts_t,
        ids=ids,
        labels=torch.tensor(labels, dtype=torch.long),
        true_logits=log.truth.logits(counts_t, ids),
    )


# ------------------------------------------------------------------------------ a log whose ids drift


@dataclass(frozen=True)
class DriftConfig:
    """A click log over ``num_days`` days whose users and items come and go (lab 10).

    Every user and item has a birth day and a lifetime: a share of them are alive on day 0, the rest are
    born on later days, and each lives a geometric number of days (items briefly, users longer). Each day's
    impressions sample the living users and items by popularity. Raw ids are distinct random integers below
    ``2**id_bits`` (like hashed 64-bit ids in production), so no table can have a row per possible id.

    The planted click logit of an impression is ``base + user_bias[u] + item_bias[i] + <user_factor[u],
    item_factor[i]> + dense term``, so each day's Bayes-optimal AUC is known exactly. Items also carry a
    dense *content* vector (what a frozen text or image encoder would give): a fixed random projection of
    the item's factor and bias, plus noise, so content predicts clicks of an item never seen before, but
    not perfectly.
    """

    num_days: int = 6
    rows_per_day: int = 30_000
    num_users: int = 500
    num_items: int = 1_000
    users_at_start: float = 0.5
    items_at_start: float = 0.4
    mean_user_life_days: float = 6.0
    mean_item_life_days: float = 4.0
    num_dense: int = 4
    latent_dim: int = 4
    content_dim: int = 16
    content_noise: float = 0.3
    id_bits: int = 40
    popularity_skew: float = 0.8
    base_logit: float = -1.0
    bias_scale: float = 0.8
    interaction_scale: float = 1.0
    dense_scale: float = 0.3
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("num_days", "rows_per_day", "num_users", "num_items", "latent_dim", "content_dim"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if not 8 <= self.id_bits <= 62:
            raise ValueError("id_bits must be 8..62 (raw ids are int64)")
        if self.num_users + self.num_items > 2 ** (self.id_bits - 1):
            raise ValueError("id_bits too small for distinct raw ids")


@dataclass
class DriftingLog:
    """A generated drifting log: ``days[d]`` is day d's :class:`ClickSplit` (features "user", "item", raw ids).

    ``user_ids`` / ``item_ids`` map each planted user/item index to its raw id; ``content`` is ``[num_items,
    content_dim]``, row i the content vector of item i (look it up by raw id with :meth:`item_content`).
    """

    config: DriftConfig
    days: list[ClickSplit]
    user_ids: torch.Tensor
    item_ids: torch.Tensor
    content: torch.Tensor
    truth: dict[str, torch.Tensor]

    def __repr__(self) -> str:
        seen: set[int] = set()
        per_day = []
        for split in self.days:
            items = set(split.ids["item"][0].tolist())
            per_day.append(f"{len(items)} items ({len(items - seen)} new)")
            seen |= items
        return f"DriftingLog({len(self.days)} days x {len(self.days[0])} rows; " + ", ".join(per_day[:3]) + ", ...)"

    def item_content(self, raw_item_ids: torch.Tensor) -> torch.Tensor:
        """Content vectors ``[N, content_dim]`` of items given by raw id."""
        order = torch.argsort(self.item_ids)
        pos = torch.searchsorted(self.item_ids[order], raw_item_ids)
        index = order[pos.clamp(max=len(order) - 1)]
        if not torch.equal(self.item_ids[index], raw_item_ids):
            raise KeyError("an id is not an item of this log")
        return self.content[index]

    def vocabulary(self, feature: str) -> int:
        """How many distinct raw ids ``feature`` ("user" or "item") takes over all days."""
        return int(torch.unique(torch.cat([split.ids[feature][0] for split in self.days])).numel())

    def first_seen(self, day: int, feature: str = "item") -> torch.Tensor:
        """``[rows of day]`` bool: rows of ``day`` whose ``feature`` id appears on no earlier day."""
        earlier = [split.ids[feature][0] for split in self.days[:day]]
        ids = self.days[day].ids[feature][0]
        if not earlier:
            return torch.ones_like(ids, dtype=torch.bool)
        return ~torch.isin(ids, torch.unique(torch.cat(earlier)))


def _lifetimes(n: int, at_start: float, num_days: int, mean_life: float, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(birth day, first day dead) per entity: a share alive from day 0, the rest born on days 1..num_days-1."""
    born = torch.randint(1, max(num_days, 2), (n,), generator=g)
    born[torch.rand(n, generator=g) < at_start] = 0
    # geometric lifetime >= 1 day with the given mean
    p = 1.0 / max(mean_life, 1.0)
    life = 1 + torch.floor(torch.log(torch.rand(n, generator=g).clamp_min(1e-12)) / math.log(1 - p + 1e-12)).long() \
        if p < 1 else torch.ones(n, dtype=torch.long)
    return born, born + life


def make_drifting_log(config: DriftConfig | None = None) -> DriftingLog:
    """Generate the drifting log described by ``config`` (the same config always gives the same log)."""
    c = config or DriftConfig()
    g = torch.Generator().manual_seed(c.seed)
    k = c.latent_dim
    factor_std = math.sqrt(c.interaction_scale / math.sqrt(k))
    truth = {
        "user_bias": torch.randn(c.num_users, generator=g) * c.bias_scale,
        "item_bias": torch.randn(c.num_items, generator=g) * c.bias_scale,
        "user_factors": torch.randn(c.num_users, k, generator=g) * factor_std,
        "item_factors": torch.randn(c.num_items, k, generator=g) * factor_std,
        "dense_weights": torch.randn(c.num_dense, generator=g) * c.dense_scale,
    }
    truth["dense_center"] = torch.log1p(_counts(100_000, c.num_dense, g).float()).mean(0)
    raw = torch.randint(0, 2**c.id_bits, (c.num_users + c.num_items,), generator=g)
    while torch.unique(raw).numel() < raw.numel():  # distinct raw ids (a repeat is rare below 2**40)
        raw = torch.randint(0, 2**c.id_bits, (c.num_users + c.num_items,), generator=g)
    user_ids, item_ids = raw[: c.num_users].long(), raw[c.num_users:].long()
    # content: a fixed "encoder" of what the item is (its factor and bias), plus noise, scaled to unit variance
    encoder = torch.randn(k + 1, c.content_dim, generator=g) / math.sqrt(k + 1)
    item_state = torch.cat([truth["item_factors"] / factor_std, (truth["item_bias"] / c.bias_scale)[:, None]], 1)
    content = item_state @ encoder + torch.randn(c.num_items, c.content_dim, generator=g) * c.content_noise
    user_born, user_dies = _lifetimes(c.num_users, c.users_at_start, c.num_days, c.mean_user_life_days, g)
    item_born, item_dies = _lifetimes(c.num_items, c.items_at_start, c.num_days, c.mean_item_life_days, g)
    user_pop = _popularity(c.num_users, c.popularity_skew, g)
    item_pop = _popularity(c.num_items, c.popularity_skew, g)
    days = []
    for day in range(c.num_days):
        users_alive = ((user_born <= day) & (day < user_dies)).double()
        items_alive = ((item_born <= day) & (day < item_dies)).double()
        user = torch.multinomial(user_pop * users_alive, c.rows_per_day, replacement=True, generator=g)
        item = torch.multinomial(item_pop * items_alive, c.rows_per_day, replacement=True, generator=g)
        counts = _counts(c.rows_per_day, c.num_dense, g)
        logit = (
            c.base_logit + truth["user_bias"][user] + truth["item_bias"][item]
            + (truth["user_factors"][user] * truth["item_factors"][item]).sum(1)
            + (torch.log1p(counts.float()) - truth["dense_center"]) @ truth["dense_weights"]
        ).float()
        labels = torch.bernoulli(torch.sigmoid(logit.double()), generator=g).long()
        one = torch.ones(c.rows_per_day, dtype=torch.long)
        ids = {"user": (user_ids[user], one), "item": (item_ids[item], one.clone())}
        days.append(ClickSplit(counts=counts, ids=ids, labels=labels, true_logits=logit))
    return DriftingLog(config=c, days=days, user_ids=user_ids, item_ids=item_ids, content=content.float(), truth=truth)


# ------------------------------------------------------------------ histories for next-item prediction


@dataclass(frozen=True)
class HistoryConfig:
    """Users' item histories for next-item prediction (lab 12).

    Each user has a latent taste; each item a latent factor and a popularity. A user's items are drawn
    independently from ``softmax(<taste, factor> * affinity + log popularity)`` over all items: the last one
    is the target, the ``history_len`` before it the input. The planted distribution gives the ceiling of
    recall@k exactly (the probability mass of the k most likely items for that user).
    """

    num_users: int = 3_000
    num_items: int = 300
    history_len: int = 10
    latent_dim: int = 8
    affinity: float = 1.6
    popularity_skew: float = 0.8
    test_users: int = 500
    seed: int = 0


@dataclass
class Histories:
    """``history[u]`` the ``history_len`` item ids user u saw, ``target[u]`` the next one; ``probs[u]`` the
    planted next-item distribution. Users ``[:num_train]`` train, the rest test."""

    config: HistoryConfig
    history: torch.Tensor
    target: torch.Tensor
    probs: torch.Tensor
    num_train: int

    def split(self, part: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(history, target, probs)`` of the "train" or "test" users."""
        s = slice(0, self.num_train) if part == "train" else slice(self.num_train, None)
        return self.history[s], self.target[s], self.probs[s]


def make_histories(config: HistoryConfig | None = None) -> Histories:
    """Generate users' histories (the same config always gives the same data)."""
    c = config or HistoryConfig()
    g = torch.Generator().manual_seed(c.seed)
    taste = torch.randn(c.num_users, c.latent_dim, generator=g) / math.sqrt(c.latent_dim)
    factor = torch.randn(c.num_items, c.latent_dim, generator=g)
    popularity = _popularity(c.num_items, c.popularity_skew, g).float()
    logits = c.affinity * taste @ factor.T + torch.log(popularity / popularity.sum())
    probs = torch.softmax(logits, dim=1)
    items = torch.multinomial(probs, c.history_len + 1, replacement=True, generator=g)
    return Histories(config=c, history=items[:, :-1].contiguous(), target=items[:, -1].contiguous(), probs=probs,
                     num_train=c.num_users - c.test_users)


def recall_ceiling(probs: torch.Tensor, k: int = 10) -> float:
    """Expected recall@k of the predictor that knows each user's planted distribution: the mean over users of
    the probability mass of their k most likely items (a single target per user)."""
    return float(probs.topk(k, dim=1).values.sum(1).mean())
