"""Cold start (lab 10): items the table has never seen, scored from their content instead of their id.

    model = coldstart.ContentClickModel(log, mode="joint")        # item = e_id + proj(content)
    model = coldstart.ContentClickModel(log, mode="fallback")     # item = e_id if known, else proj(content)
    report = coldstart.run_cold_start(model, log, align=info_nce)  # train day by day, score new vs seen items

The id tables are managed-collision tables with a row for every id the log will show, so an item misses
(reads the miss row) exactly until the day it first trains: the miss row marks "never seen". The content
vector of an item is what a frozen encoder would give (``DriftingLog.item_content``); a linear projection
maps it into the id embedding space. ``align`` is an optional loss between an item's id embedding and its
projected content (InfoNCE in the lab), added to the click loss with weight ``align_weight``.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
from torchrec import KeyedJaggedTensor

from course_lib import collisions, data

__all__ = ["ColdStartResult", "ContentClickModel", "MODES", "reference_info_nce", "run_cold_start"]

MODES = ("ids", "joint", "fallback")


def reference_info_nce(id_emb: torch.Tensor, content_emb: torch.Tensor, temperature: float) -> torch.Tensor:
    """InfoNCE from ids to content: row i of ``id_emb`` should pick row i of ``content_emb`` among all rows.

    Cosine similarities divided by ``temperature``, cross-entropy of each id row's softmax over the content
    rows against its own index, averaged over rows.
    """
    logits = nn.functional.normalize(id_emb, dim=1) @ nn.functional.normalize(content_emb, dim=1).T / temperature
    return nn.functional.cross_entropy(logits, torch.arange(len(id_emb)))


class ContentClickModel(nn.Module):
    """:class:`collisions.IdClickModel`'s click model with an item content tower.

    mode "ids": the item is its id embedding (new items read the miss row). "joint": id embedding plus
    projected content, always. "fallback": the id embedding for items in the table, the projected content
    for items that miss (never seen).
    """

    def __init__(self, log: data.DriftingLog, mode: str = "joint", embedding_dim: int = 8, hidden: int = 32) -> None:
        super().__init__()
        if mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.log = log
        rows = {f: log.vocabulary(f) + 1 for f in ("user", "item")}
        self.sparse = collisions.zch_ebc(collisions.id_tables(rows, embedding_dim), "lru")
        self.project = nn.Linear(log.config.content_dim, embedding_dim)
        self.over = nn.Sequential(nn.Linear(3 * embedding_dim + log.config.num_dense, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def parts(self, features: KeyedJaggedTensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(user embedding, item id embedding, projected content, whether the item misses the table)."""
        out = self.sparse(features)
        pooled = (out[0] if isinstance(out, tuple) else out).to_dict()
        items = features["item"].values()
        content = self.project(self.log.item_content(items))
        misses = collisions.rows_of(self.sparse, "item", items) == collisions.miss_row(self.sparse, "item")
        return pooled["user"], pooled["item"], content, misses

    def item_vector(self, item_id: torch.Tensor, content: torch.Tensor, misses: torch.Tensor) -> torch.Tensor:
        if self.mode == "ids":
            return item_id
        if self.mode == "joint":
            return item_id + content
        return torch.where(misses[:, None], content, item_id)

    def forward(self, features: KeyedJaggedTensor, dense: torch.Tensor) -> torch.Tensor:
        user, item_id, content, misses = self.parts(features)
        item = self.item_vector(item_id, content, misses)
        return self.over(torch.cat([user * item, user, item, dense], 1)).squeeze(1)


@dataclass
class ColdStartResult:
    """Mean AUCs over the scored days: on impressions of items seen before, and of items new that day."""

    mode: str
    aligned: bool
    seen_auc: float
    new_auc: float
    all_auc: float
    per_day_new: list[float]


def _train_day(model: ContentClickModel, optimizer: torch.optim.Optimizer, split: data.ClickSplit, batch_size: int,
               align: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None, align_weight: float,
               temperature: float) -> None:
    model.train()
    dense = split.dense
    for start in range(0, len(split) - batch_size + 1, batch_size):
        stop = start + batch_size
        features = split.kjt(start, stop)
        user, item_id, content, misses = model.parts(features)
        item = model.item_vector(item_id, content, misses)
        logits = model.over(torch.cat([user * item, user, item, dense[start:stop]], 1)).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, split.labels[start:stop].float())
        if align is not None:
            # one pair per distinct item of the batch: its id embedding and its projected content
            _, first = _first_occurrence(features["item"].values())
            loss = loss + align_weight * align(item_id[first], content[first], temperature)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def _first_occurrence(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    unique, inverse = torch.unique(values, return_inverse=True)
    first = torch.full((len(unique),), len(values), dtype=torch.long)
    first.scatter_reduce_(0, inverse, torch.arange(len(values)), reduce="amin")
    return unique, first


def run_cold_start(
    model: ContentClickModel,
    log: data.DriftingLog,
    align: Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor] | None = None,
    align_weight: float = 0.1,
    temperature: float = 0.1,
    lr: float = 0.2,
    batch_size: int = 512,
) -> ColdStartResult:
    """Train on day 0, score day 1 (seen items and new items apart), train on day 1, ... as ``run_days``."""
    optimizer = torch.optim.Adagrad(model.parameters(), lr=lr)
    seen, new, overall, per_day_new = [], [], [], []
    _train_day(model, optimizer, log.days[0], batch_size, align, align_weight, temperature)
    for day in range(1, len(log.days)):
        split = log.days[day]
        logits = collisions.score_day(model, split)  # eval mode: nothing is admitted
        is_new = log.first_seen(day, "item")
        seen.append(data.auc(logits[~is_new], split.labels[~is_new]))
        new.append(data.auc(logits[is_new], split.labels[is_new]))
        overall.append(data.auc(logits, split.labels))
        per_day_new.append(new[-1])
        _train_day(model, optimizer, split, batch_size, align, align_weight, temperature)
    return ColdStartResult(model.mode, align is not None, statistics.mean(seen), statistics.mean(new),
                           statistics.mean(overall), per_day_new)


# -------------------------------------------------------------------------- how fast a new id learns


def _embedding_optimizer(model: nn.Module, kind: str, lr: float) -> list[torch.optim.Optimizer]:
    """The id tables under ``kind`` ("sgd" or "rowwise_adagrad"), every other parameter under Adagrad(0.2)."""
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    tables = [p for n, p in model.named_parameters() if "embedding_bags" in n]
    others = [p for n, p in model.named_parameters() if "embedding_bags" not in n]
    table_opt: torch.optim.Optimizer
    if kind == "sgd":
        table_opt = torch.optim.SGD(tables, lr=lr)
    elif kind == "rowwise_adagrad":
        table_opt = RowWiseAdagrad(tables, lr=lr)
    else:
        raise ValueError(f"kind must be 'sgd' or 'rowwise_adagrad', got {kind!r}")
    return [table_opt, torch.optim.Adagrad(others, lr=0.2)]


def new_id_learning_curve(
    log: data.DriftingLog, kind: str, lr: float, day: int = 3, every: int = 4, batch_size: int = 256,
    held_out: float = 0.3,
) -> dict[str, list[float]]:
    """AUC on day ``day``'s new items as the model trains through that day, with ``kind`` on the id tables.

    Days before ``day`` train the model (same optimizers). Day ``day`` is split in time: the first
    ``1 - held_out`` of it trains, step by step; every ``every`` steps the model scores the impressions of
    the held-out last part whose item was new that day (never trained on them). Returns the steps, the new
    items' AUC at each, and the AUC on all held-out impressions.
    """
    torch.manual_seed(0)
    model = ContentClickModel(log, mode="ids")
    optimizers = _embedding_optimizer(model, kind, lr)

    def step(split: data.ClickSplit, dense: torch.Tensor, start: int) -> None:
        model.train()
        logits = model(split.kjt(start, start + batch_size), dense[start : start + batch_size])
        loss = nn.functional.binary_cross_entropy_with_logits(logits, split.labels[start : start + batch_size].float())
        for opt in optimizers:
            opt.zero_grad()
        loss.backward()
        for opt in optimizers:
            opt.step()

    for d in range(day):
        split = log.days[d]
        dense = split.dense
        for start in range(0, len(split) - batch_size + 1, batch_size):
            step(split, dense, start)
    split = log.days[day]
    cut = int(len(split) * (1 - held_out))
    train, test = split.rows(0, cut), split.rows(cut, len(split))
    new = log.first_seen(day, "item")[cut:]
    dense = train.dense
    curve: dict[str, list[float]] = {"step": [], "new items": [], "all": []}
    for i, start in enumerate(range(0, len(train) - batch_size + 1, batch_size)):
        if i % every == 0:
            logits = collisions.score_day(model, test)
            curve["step"].append(i)
            curve["new items"].append(data.auc(logits[new], test.labels[new]))
            curve["all"].append(data.auc(logits, test.labels))
        step(train, dense, start)
    return curve
