"""The 04_dmp checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from torchmetrics.classification import BinaryAUROC

from course_lib import data
from course_lib.checks import CheckFailed, lab04

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def per_table():
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_wise

    return {
        "t_user": row_wise(compute_kernel="fused"),
        "t_item": column_wise(ranks=[0, 1], compute_kernel="fused"),
        "t_category": data_parallel(),
        "t_terms": table_wise(rank=1, compute_kernel="fused"),
    }


# ------------------------------------------------------------------------------------------ exercise 1


def wrap(model, plan):
    from torchrec.distributed import DistributedModelParallel

    from course_lib import training

    return DistributedModelParallel(module=model, device=training.device(), plan=plan, sharders=training.sharders())


def wrap_without_plan(model, plan):
    from torchrec.distributed import DistributedModelParallel

    from course_lib import training

    return DistributedModelParallel(module=model, device=training.device(), sharders=training.sharders())


def wrap_only_the_tables(model, plan):
    from torchrec.distributed import DistributedModelParallel

    ebc = model.model.sparse_arch.embedding_bag_collection
    model.model.sparse_arch.embedding_bag_collection = DistributedModelParallel(module=ebc, plan=plan)
    return model


def wrap_that_raises(model, plan):
    return DistributedModelParallel(model, plan=plan)  # noqa: F821  (forgot the import)


def test_wrap_check_accepts_the_solution(capsys):
    lab04.check_wrap(wrap, per_table())
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (wrap_without_plan, "the plan asks for row_wise"),
        (wrap_only_the_tables, "wrap returned a DLRMTrain"),
        (wrap_that_raises, "NameError"),
    ],
)
def test_wrap_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab04.check_wrap(wrong, per_table())


# ------------------------------------------------------------------------------------------ exercise 2


def train_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def no_zero_grad(model, optimizer, batch):
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def no_step(model, optimizer, batch):
    optimizer.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    return loss.item()


def zero_grad_between_backward_and_step(model, optimizer, batch):
    loss, _ = model(batch)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    return loss.item()


def backward_on_the_logits(model, optimizer, batch):
    optimizer.zero_grad()
    loss, (_, logits, _) = model(batch)
    logits.sum().backward()
    optimizer.step()
    return loss.item()


def backward_on_another_loss(model, optimizer, batch):
    optimizer.zero_grad()
    logits = model.model(batch.dense_features, batch.sparse_features).squeeze(-1)
    loss = ((torch.sigmoid(logits) - batch.labels) ** 2).mean()
    loss.backward()
    optimizer.step()
    return loss.item()


def returns_the_loss_after_the_update(model, optimizer, batch):
    train_step(model, optimizer, batch)
    with torch.no_grad():
        return model(batch)[0].item()


def test_train_step_check_accepts_the_solution(capsys):
    lab04.check_train_step(train_step)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (no_zero_grad, "call optimizer.zero_grad\\(\\) every step"),
        (no_step, "weights did not change"),
        (zero_grad_between_backward_and_step, "weights did not change"),
        (backward_on_the_logits, "does not require grad"),
        (backward_on_another_loss, "not a gradient step on the batch's loss"),
        (returns_the_loss_after_the_update, "returned .* the batch's loss was"),
    ],
)
def test_train_step_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab04.check_train_step(wrong)


# ------------------------------------------------------------------------------------------ exercise 3


def auc_gap(logits, labels, split):
    return data.bayes_optimal_auc(split) - BinaryAUROC()(logits, labels).item()


def sign_flipped(logits, labels, split):
    return BinaryAUROC()(logits, labels).item() - data.bayes_optimal_auc(split)


def train_optimum(logits, labels, split):
    log = data.make_click_log(lab04._CHECK_CONFIG)  # what a learner reaching for log.train computes
    return data.bayes_optimal_auc(log.train) - BinaryAUROC()(logits, labels).item()


def scored_against_the_splits_labels(logits, labels, split):
    return data.bayes_optimal_auc(split) - BinaryAUROC()(logits, split.labels).item()


def test_the_check_case_tells_the_splits_apart():
    _, _, split, log = lab04._gap_case(seed=1)
    assert abs(data.bayes_optimal_auc(log.train) - data.bayes_optimal_auc(split)) > 0.005


def test_auc_gap_check_accepts_the_solution(capsys):
    lab04.check_auc_gap(auc_gap)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (sign_flipped, "sign is flipped"),
        (train_optimum, "train split's optimum"),
        (scored_against_the_splits_labels, "scored against split.labels"),
    ],
)
def test_auc_gap_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab04.check_auc_gap(wrong)
