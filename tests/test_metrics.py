"""course_lib.metrics: torchrec's RecMetricModule on 2 ranks agrees with a direct computation."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from torchmetrics.classification import BinaryAUROC

from course_lib import data, launch, metrics

cloudpickle.register_pickle_by_value(sys.modules[__name__])

ROWS = 3_000


def _predictions() -> tuple[torch.Tensor, torch.Tensor]:
    """Scores that carry some signal, and labels drawn from them (so NE < 1 and AUC > 0.5)."""
    generator = torch.Generator().manual_seed(7)
    truth = torch.randn(ROWS, generator=generator) - 0.8
    labels = torch.bernoulli(torch.sigmoid(truth), generator=generator)
    logits = truth + 0.7 * torch.randn(ROWS, generator=generator)
    return logits, labels


def _on_rank(window_rows: int) -> dict[str, float]:
    import torch.distributed as dist

    logits, labels = _predictions()
    rank, world_size = dist.get_rank(), dist.get_world_size()
    share = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
    return metrics.rec_metrics(logits[share], labels[share], window_rows=window_rows, batch_size=256)


@pytest.fixture(scope="module")
def whole_window() -> list[dict[str, float]]:
    return launch(_on_rank, ROWS, world_size=2, show_ranks=[])


def test_every_rank_gets_the_metrics_of_all_ranks(whole_window):
    assert whole_window[0] == whole_window[1]
    assert set(whole_window[0]) == {
        "ne-click|lifetime_ne", "ne-click|window_ne", "auc-click|window_auc",
        "calibration-click|lifetime_calibration", "calibration-click|window_calibration",
    }


def test_ne_equals_bce_over_the_entropy_of_the_mean_label(whole_window):
    logits, labels = _predictions()
    p = labels.double().mean()
    entropy = -(p * p.log() + (1 - p) * (1 - p).log())
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits.double(), labels.double())
    assert whole_window[0]["ne-click|lifetime_ne"] == pytest.approx((bce / entropy).item(), rel=1e-5)
    assert whole_window[0]["ne-click|window_ne"] == pytest.approx(whole_window[0]["ne-click|lifetime_ne"], rel=1e-9)
    assert metrics.normalized_entropy(logits, labels) == pytest.approx((bce / entropy).item(), rel=1e-9)


def test_auc_equals_torchmetrics_and_the_rank_formula(whole_window):
    logits, labels = _predictions()
    assert whole_window[0]["auc-click|window_auc"] == pytest.approx(float(BinaryAUROC()(logits, labels)), abs=1e-5)
    assert whole_window[0]["auc-click|window_auc"] == pytest.approx(data.auc(logits, labels), abs=1e-5)


def test_calibration_is_predicted_clicks_over_clicks(whole_window):
    logits, labels = _predictions()
    want = (torch.sigmoid(logits.double()).sum() / labels.sum()).item()
    assert whole_window[0]["calibration-click|lifetime_calibration"] == pytest.approx(want, rel=1e-5)


def test_a_window_covers_only_the_last_rows_of_each_rank():
    window = launch(_on_rank, 1_000, world_size=2, show_ranks=[])[0]  # 500 rows per rank, of 1,500 each
    logits, labels = _predictions()
    # AUC keeps exactly the last 500 rows of each rank
    last = torch.cat([torch.arange(1_000, 1_500), torch.arange(2_500, 3_000)])
    assert window["auc-click|window_auc"] == pytest.approx(data.auc(logits[last], labels[last]), abs=1e-5)
    # NE keeps whole batches: the newest ones that fit in 500 rows (the last 220 and 256 rows: 476)
    last_batches = torch.cat([torch.arange(1_024, 1_500), torch.arange(2_524, 3_000)])
    assert window["ne-click|window_ne"] == pytest.approx(
        metrics.normalized_entropy(logits[last_batches], labels[last_batches]), rel=1e-5
    )
    assert window["ne-click|lifetime_ne"] == pytest.approx(metrics.normalized_entropy(logits, labels), rel=1e-5)


def _collectives_of_compute() -> list[str]:
    from course_lib import trace

    logits, labels = _predictions()
    with trace.collectives() as log:
        metrics.rec_metrics(logits[:1_000], labels[:1_000], window_rows=ROWS, batch_size=256)
    return sorted(set(log.ops()))


def test_compute_syncs_by_all_gather_only():
    assert launch(_collectives_of_compute, world_size=2, show_ranks=[])[0] == ["all_gather", "barrier"]


def test_a_window_smaller_than_a_batch_is_refused():
    with pytest.raises(ValueError, match="must hold a whole batch"):
        metrics.rec_metric_module(window_rows=100, batch_size=256)


def test_the_planted_truth_has_the_lowest_ne():
    log = data.make_click_log(data.ClickLogConfig(num_train=2_000, num_test=4_000, seed=3))
    optimum = data.bayes_optimal_ne(log.test)
    noisy = log.test.true_logits + torch.randn(len(log.test), generator=torch.Generator().manual_seed(0))
    assert 0 < optimum < metrics.normalized_entropy(noisy, log.test.labels) < 1.2
