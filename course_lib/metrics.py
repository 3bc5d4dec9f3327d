"""Evaluate a click model the way TorchRec users do: ``torchrec.metrics.RecMetricModule`` on every rank.

    logits, labels = training.predict(model, log.test)     # this rank's share of the split
    values = metrics.rec_metrics(logits, labels, window_rows=len(log.test))   # on every rank, a collective
    values["ne-click|lifetime_ne"], values["auc-click|window_auc"], values["calibration-click|lifetime_calibration"]
    metrics.normalized_entropy(logits, labels)             # the same NE, computed directly (one process)
    data.bayes_optimal_ne(log.test)                        # the NE of the planted truth: the floor

What torchrec computes (``torchrec/metrics/ne.py``, ``auc.py``, ``calibration.py``, torchrec 1.8):

- **NE** (normalized entropy) = the mean binary cross-entropy of the predicted probabilities, divided by the
  entropy of the mean label (the cross-entropy of always predicting the click rate). 1.0 is "no better than
  the click rate"; lower is better. Both logs are base 2 in torchrec; the ratio is the same in any base.
- **calibration** = sum of predicted probabilities / number of clicks: 1.0 when the model predicts as many
  clicks as there are.
- **lifetime** values cover every row given to ``update`` since the module was made (or ``reset``);
  **window** values only the last ``window_rows`` rows of all ranks together (each rank keeps
  ``ceil(window_rows / world_size)`` of its own). AUC exists only as a window: it keeps the raw predictions
  of the window (exactly the last rows), and a lifetime AUC would keep every prediction ever made. NE and
  calibration keep sums per ``update``, and their window drops whole updates: it holds the newest updates
  whose rows fit in the window.
- ``compute()`` syncs through torchmetrics: every state of every rank is all-gathered (after an all-gather of
  its shape and a barrier) and reduced on each rank (NE's and calibration's sums added, AUC's kept
  predictions concatenated), so every rank that asks (``compute_on_all_ranks=True``) gets the metric of all
  ranks' rows together. No all-reduce runs.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from course_lib.launcher._rank import rank_device

__all__ = ["TASK", "normalized_entropy", "rec_metric_module", "rec_metrics"]

TASK = "click"  # the name of the one task; torchrec's keys read "<metric>-<task>|<window or lifetime>_<metric>"


def rec_metric_module(window_rows: int, batch_size: int, device: torch.device | None = None) -> Any:
    """A ``RecMetricModule`` with NE, AUC and calibration of one task named ``TASK`` on this process group.

    `window_rows` is the global window (all ranks' rows together); each rank's share of it must be at least
    `batch_size`, the most rows one ``update`` gets. Every rank must make it and call ``compute`` together.
    """
    from torchrec.metrics.metric_module import RecMetricModule, generate_metric_module
    from torchrec.metrics.metrics_config import (
        MetricsConfig,
        RecComputeMode,
        RecMetricDef,
        RecMetricEnum,
        RecTaskInfo,
    )

    rank, world_size = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    if math.ceil(window_rows / world_size) < batch_size:
        raise ValueError(
            f"each rank's share of the window ({math.ceil(window_rows / world_size)} rows) must hold a whole batch "
            f"({batch_size} rows): make window_rows at least {batch_size * world_size}"
        )
    task = RecTaskInfo(name=TASK, label_name="label", prediction_name="prediction", weight_name="weight")
    config = MetricsConfig(
        rec_tasks=[task],
        rec_metrics={
            kind: RecMetricDef(rec_task_indices=[0], window_size=window_rows)
            for kind in (RecMetricEnum.NE, RecMetricEnum.AUC, RecMetricEnum.CALIBRATION)
        },
        rec_compute_mode=RecComputeMode.UNFUSED_TASKS_COMPUTATION,
        compute_on_all_ranks=True,
    )
    return generate_metric_module(
        RecMetricModule,
        config,
        batch_size=batch_size,
        world_size=world_size,
        my_rank=rank,
        state_metrics_mapping={},
        device=device or torch.device("cpu"),
    )


def rec_metrics(logits: torch.Tensor, labels: torch.Tensor, window_rows: int, batch_size: int = 1024) -> dict[str, float]:
    """NE, AUC and calibration (window and lifetime) of all ranks' `logits` against their `labels`.

    Run it on every rank with that rank's predictions (``training.predict``); it feeds them to a fresh
    ``rec_metric_module`` in batches of `batch_size` rows, as an evaluation loop would, and returns
    ``compute()`` as plain numbers, the same on every rank, under torchrec's own keys
    (``"ne-click|lifetime_ne"``, ``"auc-click|window_auc"``, ...). Predictions enter as probabilities
    (``sigmoid(logits)``), as torchrec expects; every row has weight 1. The module and its states live on
    this rank's device (``launcher._rank.rank_device()``: the GPU under NCCL, whose collectives need CUDA tensors).
    """
    device = rank_device()
    module = rec_metric_module(window_rows, batch_size, device=device)
    logits = logits.detach().flatten().float().to(device)
    labels = labels.detach().flatten().float().to(device)
    for start in range(0, len(logits), batch_size):
        chunk = slice(start, start + batch_size)
        module.update(
            {"prediction": torch.sigmoid(logits[chunk]), "label": labels[chunk], "weight": torch.ones_like(labels[chunk])}
        )
    return {name: float(value) for name, value in module.compute().items()}


def normalized_entropy(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """NE computed directly: mean binary cross-entropy of ``sigmoid(logits)`` over the entropy of the mean label."""
    logits, labels = logits.detach().flatten().double(), labels.detach().flatten().double()
    cross_entropy = torch.nn.functional.binary_cross_entropy_with_logits(logits, labels).item()
    rate = labels.mean().item()
    if not 0 < rate < 1:
        raise ValueError("NE needs at least one click and one non-click")
    return cross_entropy / -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
