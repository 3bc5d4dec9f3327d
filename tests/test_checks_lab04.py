"""The 04_dmp checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
from torchmetrics.classification import BinaryAUROC

from course_lib import data
from course_lib.checks import CheckFailed, lab04

from conftest import rejects

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------------ exercise 1


def ebcs(model):
    from torchrec import EmbeddingBagCollection

    return [(path, module) for path, module in model.named_modules() if isinstance(module, EmbeddingBagCollection)]


def dmp(model, plan, **options):
    from torchrec.distributed import DistributedModelParallel

    from course_lib import training

    options = {"device": training.device(), "sharders": training.sharders(), **options}
    return DistributedModelParallel(module=model, plan=plan, **options)


def wrap(model, per_table):
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    plan = ShardingPlan({path: construct_module_sharding_plan(ebc, {t: per_table[t] for t in ebc.embedding_bags})
                         for path, ebc in ebcs(model)})
    return dmp(model, plan)


def plan_of(model, per_table, **options):
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    return ShardingPlan({path: construct_module_sharding_plan(ebc, {t: per_table[t] for t in ebc.embedding_bags}, **options)
                         for path, ebc in ebcs(model)})


def wrap_with_the_course_helpers(model, per_table):  # right: planning.module_plan per EBC, the world from the group
    import torch.distributed as dist
    from torchrec.distributed.types import ShardingPlan

    from course_lib import planning, training

    return dmp(model, ShardingPlan({
        path: planning.module_plan(ebc, {t: per_table[t] for t in ebc.embedding_bags},
                                   world_size=dist.get_world_size(), sharder=training.sharders()[0])
        for path, ebc in ebcs(model)}))


def wrap_at_the_dlrm_path(model, per_table):  # the lab's model has its EBC there; the check's model does not
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    path = "sparse_arch.embedding_bag_collection"
    ebc = model.get_submodule(path)
    return dmp(model, ShardingPlan({path: construct_module_sharding_plan(ebc, {t: per_table[t] for t in ebc.embedding_bags})}))


def wrap_under_the_dlrm_path(model, per_table):  # finds the EBC, files it under the path the lab printed
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    _, ebc = ebcs(model)[0]
    sub = {t: per_table[t] for t in ebc.embedding_bags}
    return dmp(model, ShardingPlan({"sparse_arch.embedding_bag_collection": construct_module_sharding_plan(ebc, sub)}))


def wrap_the_first_ebc_only(model, per_table):
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    path, ebc = ebcs(model)[0]
    return dmp(model, ShardingPlan({path: construct_module_sharding_plan(ebc, {t: per_table[t] for t in ebc.embedding_bags})}))


def wrap_with_the_planners_plan(model, per_table):  # per_table ignored: DMP plans
    return dmp(model, None)


def wrap_under_the_child_name(model, per_table):  # "embeddings", the attribute's name, not its path in the model
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    return dmp(model, ShardingPlan({path.split(".")[-1]: construct_module_sharding_plan(ebc, {t: per_table[t] for t in ebc.embedding_bags})
                                    for path, ebc in ebcs(model)}))


def wrap_with_the_whole_per_table(model, per_table):  # every EBC handed every table
    from torchrec.distributed.sharding_plan import construct_module_sharding_plan
    from torchrec.distributed.types import ShardingPlan

    return dmp(model, ShardingPlan({path: construct_module_sharding_plan(ebc, dict(per_table)) for path, ebc in ebcs(model)}))


def wrap_with_model_plan(model, per_table):  # the course's helper for the lab's one-EBC model
    import torch.distributed as dist

    from course_lib import training

    return dmp(model, training.model_plan(model, per_table, world_size=dist.get_world_size()))


def wrap_for_two_ranks(model, per_table):  # the lab runs on 2 ranks; this plan always does
    return dmp(model, plan_of(model, per_table, world_size=2, local_size=2))


def wrap_without_sharders(model, per_table):
    from torchrec.distributed import DistributedModelParallel

    from course_lib import training

    return DistributedModelParallel(module=model, device=training.device(), plan=plan_of(model, per_table))


def wrap_with_a_bare_sharder(model, per_table):
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return dmp(model, plan_of(model, per_table), sharders=[EmbeddingBagCollectionSharder()])


def wrap_with_another_learning_rate(model, per_table):
    from course_lib import training

    return dmp(model, plan_of(model, per_table), sharders=training.sharders(learning_rate=0.01))


def wrap_with_row_wise_adagrad(model, per_table):  # a sharder of its own: Adagrad at lr 0.1, but one sum per row
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.1})
    return dmp(model, plan_of(model, per_table), sharders=[sharder])


def wrap_without_data_parallel(model, per_table):
    return dmp(model, plan_of(model, per_table), init_data_parallel=False)


def wrap_only_the_tables(model, per_table):  # DMP around each EBC, not around the model
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.types import ShardingPlan

    plan = plan_of(model, per_table)
    for path, ebc in ebcs(model):
        tower = model.get_submodule(path.rsplit(".", 1)[0])
        tower.embeddings = DistributedModelParallel(module=ebc, plan=ShardingPlan({"": plan.plan[path]}))
    return model


def wrap_that_raises(model, per_table):
    return DistributedModelParallel(model, plan=plan_of(model, per_table))  # noqa: F821  (forgot the import)


def wrap_on_meta(model, per_table):
    import torch

    return dmp(model, plan_of(model, per_table), device=torch.device("meta"))


def test_wrap_check_accepts_the_solution(capsys):
    lab04.check_wrap(wrap)
    assert capsys.readouterr().out.startswith("✓")


def test_wrap_check_accepts_the_course_helpers_per_ebc(capsys):
    lab04.check_wrap(wrap_with_the_course_helpers)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (wrap_at_the_dlrm_path, "the check's model is not the DLRM"),
        (wrap_under_the_dlrm_path, "'sparse_arch.embedding_bag_collection'] is not a path of this model"),
        (wrap_the_first_ebc_only, "table 't_item' is not sharded: the plan has no entry for its EBC, at 'candidate_tower.embeddings'"),
        (wrap_with_the_planners_plan, "per_table asks for row_wise"),
        (wrap_under_the_child_name, "['embeddings'] is not a path of this model"),
        (wrap_with_the_whole_per_table, "give each EBC only its own tables"),
        (wrap_with_model_plan, "training.model_plan plans a model with one EBC"),
        (wrap_for_two_ranks, "on 3 ranks, wrap(model, per_table) failed"),
        (wrap_without_sharders, "exact SGD at lr 0.01: fbgemm's default"),
        (wrap_with_a_bare_sharder, "exact SGD at lr 0.01"),
        (wrap_with_another_learning_rate, "train at lr 0.01, the course's sharders use 0.1"),
        (wrap_with_row_wise_adagrad, "one Adagrad sum per row"),
        (wrap_without_data_parallel, "did not wrap the dense part in DistributedDataParallel"),
        (wrap_only_the_tables, "wrap returned a TwoTower"),
        (wrap_that_raises, "NameError"),
        (wrap_on_meta, "raised"),
    ],
)
def test_wrap_check_rejects_wrong_answers(wrong, words):
    rejects(lab04.check_wrap, wrong, match=words)


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


def step_before_backward(model, optimizer, batch):
    optimizer.zero_grad()
    loss, _ = model(batch)
    optimizer.step()
    loss.backward()
    return loss.item()


def returns_the_first_batch_loss_forever(model, optimizer, batch, _first=[]):
    loss = train_step(model, optimizer, batch)
    _first.append(loss)
    return _first[0]


def scales_the_dense_features_in_place(model, optimizer, batch):
    batch.dense_features.div_(batch.dense_features.abs().max())  # "normalise the inputs" on the caller's batch
    return train_step(model, optimizer, batch)


def casts_the_callers_labels(model, optimizer, batch):
    batch.labels = batch.labels.float()
    return train_step(model, optimizer, batch)


def returns_the_loss_tensor(model, optimizer, batch):
    optimizer.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    return loss.detach()


def steps_an_optimizer_of_its_own(model, optimizer, batch):
    own = torch.optim.SGD(model.parameters(), lr=optimizer.param_groups[0]["lr"])
    own.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    own.step()
    return loss.item()


def updates_the_weights_by_hand(model, optimizer, batch):
    lr = optimizer.param_groups[0]["lr"]
    model.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p -= lr * p.grad
    return loss.item()


def sets_the_learning_rate(model, optimizer, batch):
    for group in optimizer.param_groups:
        group["lr"] = 0.1
    return train_step(model, optimizer, batch)


def steps_with_a_closure(model, optimizer, batch):  # right, if unusual
    def closure():
        optimizer.zero_grad()
        loss, _ = model(batch)
        loss.backward()
        return loss
    return optimizer.step(closure).item()


def test_train_step_check_accepts_a_closure(capsys):
    lab04.check_train_step(steps_with_a_closure)
    assert capsys.readouterr().out.startswith("✓")


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
        (step_before_backward, "weights did not change"),
        (returns_the_first_batch_loss_forever, "step 2 returned .* the batch's loss was"),
        (scales_the_dense_features_in_place, "train_step changed its argument 3 \\(a Batch\\) in place"),
        (casts_the_callers_labels, "train_step changed its argument 3 \\(a Batch\\) in place"),
        (returns_the_loss_tensor, "returned a tensor"),
        (steps_an_optimizer_of_its_own, "the optimizer it was given never stepped"),
        (updates_the_weights_by_hand, "the optimizer it was given never stepped"),
        (sets_the_learning_rate, "changed the learning rate of the optimizer it was given"),
    ],
)
def test_train_step_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab04.check_train_step(wrong)


# ------------------------------------------------------------------------------------------ exercise 3


def pooled(results):
    return torch.cat([r["logits"] for r in results]), torch.cat([r["labels"] for r in results])


def auc_gap(results, split):
    logits, labels = pooled(results)
    return data.bayes_optimal_auc(split) - BinaryAUROC()(logits, labels).item()


def auc_gap_of_probabilities(results, split):  # right: the AUC is rank-based, sigmoid keeps the order
    logits, labels = pooled(results)
    return data.bayes_optimal_auc(split) - data.auc(logits.sigmoid(), labels)


def mean_of_the_ranks_aucs(results, split):
    aucs = [BinaryAUROC()(r["logits"], r["labels"]).item() for r in results]
    return data.bayes_optimal_auc(split) - sum(aucs) / len(aucs)


def size_weighted_mean_of_the_ranks_aucs(results, split):
    aucs = [(BinaryAUROC()(r["logits"], r["labels"]).item(), len(r["labels"])) for r in results]
    return data.bayes_optimal_auc(split) - sum(a * n for a, n in aucs) / sum(n for _, n in aucs)


def rank_0_only(results, split):
    return data.bayes_optimal_auc(split) - BinaryAUROC()(results[0]["logits"], results[0]["labels"]).item()


def first_two_ranks(results, split):  # the lab has 2 ranks
    logits, labels = pooled(results[:2])
    return data.bayes_optimal_auc(split) - BinaryAUROC()(logits, labels).item()


def labels_of_other_ranks(results, split):  # the labels gathered in the other order
    logits = torch.cat([r["logits"] for r in results])
    labels = torch.cat([r["labels"] for r in reversed(results)])
    return data.bayes_optimal_auc(split) - BinaryAUROC()(logits, labels).item()


def the_lab_printed_auc(results, split):  # results[0]["auc"]: the lab's results hold one; the check's do not
    return data.bayes_optimal_auc(split) - results[0]["auc"]


def sign_flipped(results, split):
    return -auc_gap(results, split)


def train_optimum(results, split):
    log = data.make_click_log(lab04._CHECK_CONFIG)  # what a learner reaching for log.train computes
    return data.bayes_optimal_auc(log.train) - BinaryAUROC()(*pooled(results)).item()


def scored_against_the_splits_labels(results, split):
    logits, _ = pooled(results)
    return data.bayes_optimal_auc(split) - BinaryAUROC()(logits, split.labels).item()


def optimum_of_itself(results, split):
    return data.bayes_optimal_auc(split) - BinaryAUROC()(split.true_logits, split.labels).item()


def empirical_optimum(results, split):  # right: the split's own true logits against its labels is the optimum
    return data.auc(split.true_logits, split.labels) - data.auc(*pooled(results))


def one_minus_the_model_auc(results, split):
    return 1 - BinaryAUROC()(*pooled(results)).item()


def the_first_cases_number(results, split):  # hard-coded: the check's first case, computed once
    first, first_split, _ = lab04._gap_case(seed=1)
    return auc_gap(first, first_split)


def relative_gap(results, split):
    optimum = data.bayes_optimal_auc(split)
    return (optimum - BinaryAUROC()(*pooled(results)).item()) / optimum


def sigmoid_in_place(results, split):  # right number, but the caller's logits are now probabilities
    for r in results:
        r["logits"].sigmoid_()
    return auc_gap(results, split)


def binned_auc(results, split):  # 200 thresholds: off in the 5th decimal
    logits, labels = pooled(results)
    return data.bayes_optimal_auc(split) - BinaryAUROC(thresholds=200)(logits.sigmoid(), labels).item()


def absolute_gap(results, split):  # "the gap" as a distance: a model that beats the optimum (a leak) is hidden
    return abs(auc_gap(results, split))


def gap_floored_at_zero(results, split):  # "nothing is left to learn" is 0, so never below it
    return max(0.0, auc_gap(results, split))


def test_the_check_case_tells_the_splits_apart():
    _, split, log = lab04._gap_case(seed=1)
    assert abs(data.bayes_optimal_auc(log.train) - data.bayes_optimal_auc(split)) > 0.005


def test_the_check_case_tells_pooled_from_per_rank():
    for results, _, _ in (lab04._gap_case(seed=1), lab04._gap_case(2, lab04._SECOND_CONFIG, (0.5, 0.2, 0.3))):
        per_rank = [data.auc(r["logits"], r["labels"]) for r in results]
        rates = [r["labels"].float().mean().item() for r in results]
        assert abs(data.auc(*pooled(results)) - sum(per_rank) / len(per_rank)) > 0.02
        assert max(rates) - min(rates) > 0.2 and len({len(r["labels"]) for r in results}) == len(results)


@pytest.mark.parametrize("right", [auc_gap, auc_gap_of_probabilities, empirical_optimum])
def test_auc_gap_check_accepts_the_solution(right, capsys):
    lab04.check_auc_gap(right)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (mean_of_the_ranks_aucs, "the mean of the ranks' own AUCs"),
        (size_weighted_mean_of_the_ranks_aucs, "averaged by their sizes"),
        (rank_0_only, "rank 0's share only"),
        (first_two_ranks, "on 3 ranks of another log"),
        (labels_of_other_ranks, "scored against other ranks' labels"),
        (the_lab_printed_auc, "KeyError"),
        (sign_flipped, "sign is flipped"),
        (train_optimum, "train split's optimum"),
        (scored_against_the_splits_labels, "scored against split.labels"),
        (optimum_of_itself, "compared with itself"),
        (one_minus_the_model_auc, "the optimum is missing"),
        (the_first_cases_number, "on 3 ranks of another log"),
        (relative_gap, "expected"),
        (sigmoid_in_place, "changed the logits or labels it was given"),
        (binned_auc, "close, not exact"),
        (absolute_gap, "the gap was made positive"),
        (gap_floored_at_zero, "the gap was made positive"),
    ],
)
def test_auc_gap_check_rejects_wrong_answers(wrong, words):
    rejects(lab04.check_auc_gap, wrong, match=words)


# ------------------------------------------------------------------------------------------ exercise 4


def fold_ids(batch, modulo=20):
    from torchrec import KeyedJaggedTensor
    from torchrec.datasets.utils import Batch

    raw = batch.sparse_features
    ids = KeyedJaggedTensor(keys=raw.keys(), values=raw.values() % modulo, lengths=raw.lengths())
    return Batch(dense_features=batch.dense_features, sparse_features=ids, labels=batch.labels)


def capped_model(dlrm):
    from torchrec.models.dlrm import DLRMTrain

    class PipelinedModel(DLRMTrain):
        def forward(self, batch):
            logits = self.model(batch.dense_features.clamp(max=2.0), batch.sparse_features).squeeze(-1)
            loss = self.loss_fn(logits, batch.labels.float())
            return loss, (loss.detach(), logits.detach(), batch.labels)

    return PipelinedModel(dlrm)


def plain_dlrm(dlrm):
    from torchrec.models.dlrm import DLRMTrain

    return DLRMTrain(dlrm)


def unchanged(batch):
    return batch


def fold_and_cap(batch):
    from torchrec.datasets.utils import Batch

    folded = fold_ids(batch)
    return Batch(dense_features=batch.dense_features.clamp(max=2.0), sparse_features=folded.sparse_features,
                 labels=batch.labels)


def fold_as_a_dict(batch):
    folded = fold_ids(batch)
    return {"dense_features": folded.dense_features, "sparse_features": folded.sparse_features, "labels": folded.labels}


def test_pipelineable_check_accepts_the_solution(capsys):
    lab04.check_pipelineable(capped_model, fold_ids)
    assert capsys.readouterr().out.startswith("✓")


def test_pipelineable_check_accepts_both_steps_in_the_loader(capsys):
    lab04.check_pipelineable(plain_dlrm, fold_and_cap)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "model_class, prepare, words",
    [
        (lab04._raw_log_model, unchanged, "will NOT pipeline"),
        (lab04._raw_log_model, fold_ids, "will NOT pipeline"),
        (plain_dlrm, fold_ids, "(?s)step 1: loss .* capped at 2"),
        (capped_model, unchanged, "(?s)step 1: loss .* folded exactly once"),
        (plain_dlrm, unchanged, "step 1: loss"),
        (capped_model, lambda batch: fold_ids(batch, modulo=50), "step 1: loss"),
        (capped_model, fold_as_a_dict, "raised"),
    ],
)
def test_pipelineable_check_rejects_wrong_answers(model_class, prepare, words):
    with pytest.raises(CheckFailed, match=words):
        lab04.check_pipelineable(model_class, prepare)


# ------------------------------------------------------------------ more wrong answers (adversarial review)


def test_pipelineable_pass_line_does_not_claim_where_the_dense_work_is(capsys):
    # moving the cap into the loader too is right (issue 25): the pass line must not say "the rest stays in forward"
    lab04.check_pipelineable(plain_dlrm, fold_and_cap)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "stays in forward" not in out and "may stay in forward or move too" in out
