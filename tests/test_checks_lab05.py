"""The 05_sparse_optimizers checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter

from course_lib.checks import CheckFailed, lab05

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# ------------------------------------------------------------------------------------------ exercise 1


def rowwise_adagrad_sharder(learning_rate):
    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": learning_rate}
    )


def per_element_adagrad(learning_rate):
    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": learning_rate}
    )


def deprecated_rowwise_adagrad(learning_rate):
    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.ROWWISE_ADAGRAD, "learning_rate": learning_rate}
    )


def no_optimizer(learning_rate):
    return EmbeddingBagCollectionSharder(fused_params={"learning_rate": learning_rate})


def no_learning_rate(learning_rate):
    return EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD})


def only_the_fused_params(learning_rate):
    return {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": learning_rate}


def a_typed_in_learning_rate(learning_rate):
    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD, "learning_rate": 0.05}
    )


def a_list_of_sharders(learning_rate):
    return [rowwise_adagrad_sharder(learning_rate)]


def adam_on_cpu(learning_rate):
    return EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.ADAM, "learning_rate": learning_rate})


def plain_sgd(learning_rate):
    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": learning_rate}
    )


def ema_rowwise_adagrad(learning_rate):  # "the row-wise one" from section 4's list: an EMA variant, not Adagrad
    return EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD, "learning_rate": learning_rate}
    )


def the_optimizers_name(learning_rate):  # the name section 4 prints, as a string: fbgemm wants the enum
    return EmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_row_wise_adagrad", "learning_rate": learning_rate})


_FUSED_PARAMS = {"optimizer": EmbOptimType.EXACT_ROWWISE_ADAGRAD}


def one_shared_dict(learning_rate):  # each call updates the dict the previous sharder holds
    _FUSED_PARAMS["learning_rate"] = learning_rate
    return EmbeddingBagCollectionSharder(fused_params=_FUSED_PARAMS)


def test_rowwise_sharder_check_accepts_the_solution(capsys):
    lab05.check_rowwise_sharder(rowwise_adagrad_sharder)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (per_element_adagrad, "that is \\(per-element\\) Adagrad"),
        (deprecated_rowwise_adagrad, "deprecated"),
        (no_optimizer, "keeps no state"),
        (no_learning_rate, "learning rate is 0.01"),
        (only_the_fused_params, "returned a dict"),
        (a_typed_in_learning_rate, "sets the learning rate to 0.05"),
        (a_list_of_sharders, "returned a list"),
        (adam_on_cpu, "raised"),
        (plain_sgd, "keeps no state"),
        (one_shared_dict, "both sharders hold the same fused_params dict"),
        (the_optimizers_name, "(?s)exact_row_wise_adagrad is not supported in CPU mode.*takes the enum.*not its name as a string"),
        (ema_rowwise_adagrad, "(?s)optimizer is ema_in_place_row_wise_adagrad: .*moving average .*EXACT_ROWWISE_ADAGRAD"),
    ],
)
def test_rowwise_sharder_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab05.check_rowwise_sharder(wrong)


# ------------------------------------------------------------------------------------------ exercise 2


def combined_optimizer(model, make_dense):
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())), make_dense)
    return CombinedOptimizer([model.fused_optimizer, dense])


def dense_only(model, make_dense):
    return KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(model.named_parameters())), make_dense)


def plain_torch_optimizer(model, make_dense):
    return make_dense(list(model.parameters()))


def only_the_dense_layers(model, make_dense):
    params = {n: p for n, p in model.named_parameters() if ".dense_arch." in n or ".over_arch." in n}
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, make_dense)])


def unfiltered(model, make_dense):
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(dict(model.named_parameters()), make_dense)])


def own_dense_optimizer(model, make_dense):
    params = dict(in_backward_optimizer_filter(model.named_parameters()))
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, lambda p: torch.optim.SGD(p, lr=0.1))])


def only_the_fused_optimizer(model, make_dense):
    return model.fused_optimizer


def reversed_filter(model, make_dense):
    params = dict(in_backward_optimizer_filter(model.named_parameters(), include=True))
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, make_dense)])


def unkeyed_dense_optimizer(model, make_dense):
    params = [p for _, p in in_backward_optimizer_filter(model.named_parameters())]
    return CombinedOptimizer([model.fused_optimizer, make_dense(params)])


def names_the_fused_tables(model, make_dense):  # the tables the lab's plan fused, typed in
    params = {n: p for n, p in model.named_parameters() if "t_user" not in n and "t_item" not in n}
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, make_dense)])


def names_the_data_parallel_tables(model, make_dense):  # the dense layers and the tables the lab's plan replicated
    params = {n: p for n, p in model.named_parameters()
              if "embedding_bags" not in n or "t_category" in n or "t_terms" in n}
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, make_dense)])


def names_the_data_parallel_tables_of_the_plan(model, make_dense):  # "not data-parallel" taken for "fused"
    replicated = {table for per_module in model.plan.plan.values() for table, spec in per_module.items()
                  if spec.sharding_type == "data_parallel"}
    params = {n: p for n, p in model.named_parameters()
              if "embedding_bags" not in n or any(f".{table}." in n for table in replicated)}
    return CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, make_dense)])


def test_combined_optimizer_check_accepts_the_solution(capsys):
    lab05.check_combined_optimizer(combined_optimizer)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (dense_only, "lacks the fused tables' state"),
        (plain_torch_optimizer, "lacks the fused tables' state"),
        (only_the_dense_layers, "unchanged on rank 0: t_category.weight, t_terms.weight"),
        (unfiltered, "Duplicate param key"),
        (own_dense_optimizer, "never called make_dense"),
        (only_the_fused_optimizer, "never called make_dense"),
        (reversed_filter, "Duplicate param key|unchanged"),
        (unkeyed_dense_optimizer, "raised"),
        (names_the_fused_tables, "with another plan .*Duplicate param key"),
        (names_the_data_parallel_tables, "with another plan .*Duplicate param key"),
        (names_the_data_parallel_tables_of_the_plan,
         "with a plan where t_item is sharded table-wise on the dense kernel .*unchanged on rank 1: t_item.weight"),
    ],
)
def test_combined_optimizer_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab05.check_combined_optimizer(wrong)


# ------------------------------------------------------------------------------------------ exercise 3

ROWS, DIM, WORLD = 1_000_000, 16, 2
MEASURED = {  # what the lab measured on rank 0
    EmbOptimType.EXACT_SGD: 0,
    EmbOptimType.EXACT_ADAGRAD: ROWS // WORLD * DIM * 4,
    EmbOptimType.EXACT_ROWWISE_ADAGRAD: ROWS // WORLD * 4,
}
PER_ROW = {EmbOptimType.EXACT_SGD: lambda columns: 0, EmbOptimType.EXACT_ADAGRAD: lambda columns: columns,
           EmbOptimType.EXACT_ROWWISE_ADAGRAD: lambda columns: 1}


def state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding):  # the solution's
    if sharding == "row_wise":
        block = -(-num_rows // world_size)
        rows = [max(0, min(block, num_rows - rank * block)) for rank in range(world_size)]
        columns = embedding_dim
    elif sharding == "column_wise":
        rows, columns = [num_rows] * world_size, embedding_dim // world_size
    else:
        rows, columns = [num_rows] + [0] * (world_size - 1), embedding_dim
    return [r * PER_ROW[optimizer](columns) * 4 for r in rows]


def even_rows(num_rows, embedding_dim, world_size, optimizer, sharding):  # the lab's formula: rows divide
    if sharding == "row_wise":
        return [num_rows // world_size * PER_ROW[optimizer](embedding_dim) * 4] * world_size
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def full_blocks(num_rows, embedding_dim, world_size, optimizer, sharding):  # ceil on every rank, the last too
    if sharding == "row_wise":
        return [math.ceil(num_rows / world_size) * PER_ROW[optimizer](embedding_dim) * 4] * world_size
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def remainder_to_the_last(num_rows, embedding_dim, world_size, optimizer, sharding):  # floor each, the rest last
    if sharding == "row_wise":
        rows = [num_rows // world_size] * world_size
        rows[-1] += num_rows - sum(rows)
        return [r * PER_ROW[optimizer](embedding_dim) * 4 for r in rows]
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def column_wise_as_row_wise(num_rows, embedding_dim, world_size, optimizer, sharding):
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer,
                                "row_wise" if sharding == "column_wise" else sharding)


def row_state_split_by_columns(num_rows, embedding_dim, world_size, optimizer, sharding):
    # "a rank holds 1/W of the table, so 1/W of its state": right for Adagrad, not for row-wise Adagrad
    if sharding == "column_wise" and optimizer == EmbOptimType.EXACT_ROWWISE_ADAGRAD:
        return [num_rows // world_size * 4] * world_size
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def column_shards_of_full_width(num_rows, embedding_dim, world_size, optimizer, sharding):
    if sharding == "column_wise":
        return [num_rows * PER_ROW[optimizer](embedding_dim) * 4] * world_size
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def table_wise_spread(num_rows, embedding_dim, world_size, optimizer, sharding):
    if sharding == "table_wise":
        whole = state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)[0]
        return [whole // world_size] * world_size
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def table_wise_everywhere(num_rows, embedding_dim, world_size, optimizer, sharding):
    if sharding == "table_wise":
        return [state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)[0]] * world_size
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def values_not_bytes(num_rows, embedding_dim, world_size, optimizer, sharding):
    return [b // 4 for b in state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)]


def per_element_rowwise(num_rows, embedding_dim, world_size, optimizer, sharding):
    if optimizer == EmbOptimType.EXACT_ROWWISE_ADAGRAD:
        optimizer = EmbOptimType.EXACT_ADAGRAD
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def two_states(num_rows, embedding_dim, world_size, optimizer, sharding):
    factor = 2 if optimizer == EmbOptimType.EXACT_ADAGRAD else 1
    return [factor * b for b in state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)]


def weights_and_state(num_rows, embedding_dim, world_size, optimizer, sharding):
    weights = state_bytes_per_rank(num_rows, embedding_dim, world_size, EmbOptimType.EXACT_ADAGRAD, sharding)
    return [w + b for w, b in zip(weights, state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding))]


def the_lab_width(num_rows, embedding_dim, world_size, optimizer, sharding):  # 16 typed in for embedding_dim
    return state_bytes_per_rank(num_rows, 16, world_size, optimizer, sharding)


def a_sixteenth_of_adagrad(num_rows, embedding_dim, world_size, optimizer, sharding):  # section 4's 1/16
    if optimizer == EmbOptimType.EXACT_ROWWISE_ADAGRAD:
        adagrad = state_bytes_per_rank(num_rows, embedding_dim, world_size, EmbOptimType.EXACT_ADAGRAD, sharding)
        return [b // 16 for b in adagrad]
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)


def one_number(num_rows, embedding_dim, world_size, optimizer, sharding):  # exercise 3's old answer: rank 0 only
    return state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)[0]


def true_division(num_rows, embedding_dim, world_size, optimizer, sharding):  # num_rows / world_size: floats
    return [num_rows / world_size * PER_ROW[optimizer](embedding_dim) * 4] * world_size


def the_lab_world(num_rows, embedding_dim, world_size, optimizer, sharding):  # 2 ranks typed in
    return state_bytes_per_rank(num_rows, embedding_dim, 2, optimizer, sharding)


def the_checks_world(num_rows, embedding_dim, world_size, optimizer, sharding):  # 2 for the lab, 3 otherwise
    return state_bytes_per_rank(num_rows, embedding_dim, 2 if num_rows == ROWS else 3, optimizer, sharding)


@pytest.fixture(scope="module")
def measured_once():
    """A launch that measures fbgemm once and hands the same per-rank results to every wrong answer's check."""
    from course_lib import launch

    cache = {}

    def cached_launch(fn, *args, **kwargs):
        key = (fn.__name__, repr(args), kwargs.get("world_size"))
        if key not in cache:
            cache[key] = launch(fn, *args, **kwargs)
        return cache[key]

    return cached_launch


def test_the_formula_is_what_fbgemm_holds_on_4_ranks():  # the cases the check computes rather than measures
    from course_lib import launch

    cases = [(1_001, 32, "row_wise"), (5, 8, "row_wise"), (64, 16, "column_wise"), (96, 8, "table_wise")]
    cases = [(r, d, s, o) for r, d, s in cases for o in PER_ROW]
    per_rank = launch(lab05.measure_state_bytes, cases, world_size=4, show_ranks=[])
    for i, (rows, dim, sharding, optimizer) in enumerate(cases):
        assert [held[i] for held in per_rank] == lab05._state_bytes(rows, dim, 4, optimizer, sharding), cases[i]


def test_state_bytes_check_accepts_the_solution(capsys):
    lab05.check_state_bytes(state_bytes_per_rank, MEASURED, ROWS, DIM, WORLD)
    assert capsys.readouterr().out.startswith("✓")


def test_state_bytes_check_accepts_numpy_integers_and_a_tuple(capsys, measured_once):
    import numpy as np

    lab05.check_state_bytes(lambda *args: tuple(np.int64(b) for b in state_bytes_per_rank(*args)),
                            MEASURED, ROWS, DIM, WORLD, launch=measured_once)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (even_rows, r"10, 12, 3, EXACT_ADAGRAD, 'row_wise'\) = \[144, 144, 144\]; fbgemm measured \[192, 192, 96\]"
                    r"\n.*ceil\(num_rows / world_size\)"),
        (full_blocks, "the last ranks hold what is left"),
        (remainder_to_the_last, r"= \[144, 144, 192\]; fbgemm measured \[192, 192, 96\]"),
        (column_wise_as_row_wise, "column-wise is not row-wise: every rank holds every row"),
        (row_state_split_by_columns, "EXACT_ROWWISE_ADAGRAD, 'column_wise'.*\n.*one value per row in every shard"),
        (column_shards_of_full_width, "embedding_dim / world_size of the columns"),
        (table_wise_spread, "table-wise does not split the table"),
        (table_wise_everywhere, "table-wise places the table on rank 0 only"),
        (values_not_bytes, "4 bytes"),
        (per_element_rowwise, "one value per row, not one per element"),
        (two_states, "two states is Adam"),
        (weights_and_state, "SGD keeps no state .*weights are not optimizer state"),
        (the_lab_width, "use the embedding_dim argument"),
        (a_sixteenth_of_adagrad, r"10, 12, 3, EXACT_ROWWISE_ADAGRAD, 'row_wise'\).*\n.*1/16 only"),
        (one_number, "expected a list of 2 byte counts, one per rank"),
        (true_division, "a float: a byte count is a whole number"),
        (the_lab_world, "expected a list of 3 byte counts"),
        (the_checks_world, "expected a list of 4 byte counts"),
    ],
)
def test_state_bytes_check_rejects_wrong_answers(wrong, words, measured_once):
    with pytest.raises(CheckFailed, match=words):
        lab05.check_state_bytes(wrong, MEASURED, ROWS, DIM, WORLD, launch=measured_once)


def test_state_bytes_check_rejects_a_wrong_measurement():
    wrong = {**MEASURED, EmbOptimType.EXACT_ADAGRAD: MEASURED[EmbOptimType.EXACT_ADAGRAD] * 2}
    with pytest.raises(CheckFailed, match="not the one section 4 made"):
        lab05.check_state_bytes(state_bytes_per_rank, wrong, ROWS, DIM, WORLD)


# ------------------------------------------------------------------------------------------ exercise 4


def choose_by_budget(budget_fraction):  # the solution: row-wise Adagrad where its state fits, else SGD at a large rate
    if 1 / 16 <= budget_fraction:
        return rowwise_adagrad_sharder(0.1)
    return plain_sgd(50.0)


def choose_by_a_typed_in_cutoff(budget_fraction):  # a cut-off between the lab's budgets, not row-wise's 1/16 share
    if budget_fraction > 0.05:
        return rowwise_adagrad_sharder(0.1)
    return plain_sgd(50.0)


def choose_rowwise(budget_fraction):  # the old exercise's answer, whatever the budget
    return rowwise_adagrad_sharder(0.1)


def choose_adagrad(budget_fraction):
    return per_element_adagrad(0.1)


def choose_default_sgd(budget_fraction):
    return EmbeddingBagCollectionSharder()


def choose_sgd_with_a_large_rate(budget_fraction):
    return plain_sgd(1.0)


def choose_by_budget_with_default_sgd(budget_fraction):  # fits every budget, but SGD at fbgemm's rate trains too little
    if 1 / 16 <= budget_fraction:
        return rowwise_adagrad_sharder(0.1)
    return EmbeddingBagCollectionSharder()


def choose_fused_adam(budget_fraction):
    return adam_on_cpu(0.01)


def choose_a_list(budget_fraction):
    return [rowwise_adagrad_sharder(0.1)]


class DenseKernelSharder(EmbeddingBagCollectionSharder):  # no fused kernel: no fused state to measure
    def compute_kernels(self, sharding_type, compute_device_type):
        return ["dense"]


def choose_the_dense_kernel(budget_fraction):  # the state moves to the dense optimizer, outside the fused one
    return DenseKernelSharder()


def test_budget_check_rejects_tables_moved_off_the_fused_kernel():
    with pytest.raises(CheckFailed, match=r"choose_sharder\(1/8\): with your sharder the tables \['t_item', 't_user'\] "
                                          r"are no longer fused: .* Adam, two fp32 values per element"):
        lab05.check_budget_choice(choose_the_dense_kernel)


def choose_rowwise_or_give_up(budget_fraction):  # "nothing fits 1/32": the check reports it, without a TypeError
    if 1 / 16 <= budget_fraction:
        return rowwise_adagrad_sharder(0.1)
    raise ValueError("no optimizer fits")


def test_budget_check_reports_an_answer_that_raises_for_one_budget():
    with pytest.raises(CheckFailed, match=r"choose_sharder\(1/32\) raised ValueError: no optimizer fits"):
        lab05.check_budget_choice(choose_rowwise_or_give_up)


def test_budget_check_accepts_the_solution(capsys):
    lab05.check_budget_choice(choose_by_budget)
    out = capsys.readouterr().out
    assert out.startswith("✓") and "the choices for 1/18, 1/16, 1 fit their budgets too" in out


_CHOOSE_SHARDER_CELL = """
def choose_sharder(budget_fraction):
    if 1 / 16 <= budget_fraction:
        return rowwise_adagrad_sharder(0.1)
    return EmbeddingBagCollectionSharder(fused_params={"optimizer": EmbOptimType.EXACT_SGD, "learning_rate": 50.0})
"""


def test_budget_check_holds_the_sharder_it_builds_on_to_exercise_1():
    # exercise 1's shared dict does no harm here (every row-wise sharder has lr 0.1), so only exercise 1's check saw it
    namespace = {"EmbeddingBagCollectionSharder": EmbeddingBagCollectionSharder, "EmbOptimType": EmbOptimType,
                 "rowwise_adagrad_sharder": one_shared_dict}
    exec(_CHOOSE_SHARDER_CELL, namespace)  # noqa: S102  (a cell's code, in a namespace as the notebook's)
    with pytest.raises(CheckFailed, match=r"both sharders hold the same fused_params dict \(choose_sharder builds on "
                                          r"it, and exercise 1's check refuses it\)"):
        lab05.check_budget_choice(namespace["choose_sharder"])


def test_budget_check_rejects_a_typed_in_cutoff():  # right at 1/8 and 1/32, over the budget at 1/18
    with pytest.raises(CheckFailed, match=r"choose_sharder\(1/18\): exact_row_wise_adagrad keeps 1/16 \(6.2%\) of the "
                                          r"table bytes as state; the budget is 1/18 \(5.6%\)"):
        lab05.check_budget_choice(choose_by_a_typed_in_cutoff)


def choose_fused_adam_where_all_fits(budget_fraction):  # an optimizer the check has no share for: measured
    return adam_on_cpu(0.01) if budget_fraction >= 1 else choose_by_budget(budget_fraction)


def test_untrained_budgets_measure_an_optimizer_of_unknown_share():
    from course_lib import launch

    def no_launch(*args, **kwargs):
        pytest.fail("the shares of the solution's optimizers are known: nothing to launch")

    lab05._check_untrained_budgets(choose_by_budget, no_launch)
    with pytest.raises(CheckFailed, match=r"choose_sharder\(1\): sharding with it raised .*adam"):
        lab05._check_untrained_budgets(choose_fused_adam_where_all_fits, launch)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (choose_rowwise, r"choose_sharder\(1/32\): exact_row_wise_adagrad keeps 6.2% of the table bytes as state on a "
                         r"rank; the budget is 1/32 \(3.1%\), so this job would not fit its memory"),
        (choose_adagrad, r"choose_sharder\(1/8\): exact_adagrad keeps 100.0% of the table bytes"),
        (choose_default_sgd, r"choose_sharder\(1/8\): exact_sgd at lr 0.01 reaches AUC .*ranks clicks measurably worse"),
        (choose_sgd_with_a_large_rate, r"choose_sharder\(1/8\): exact_sgd at lr 1 reaches AUC"),
        (choose_by_budget_with_default_sgd, r"choose_sharder\(1/32\): exact_sgd at lr 0.01 reaches AUC"),
        (choose_fused_adam, "raised"),
        (choose_a_list, r"choose_sharder\(1/8\) returned a list"),
    ],
)
def test_budget_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab05.check_budget_choice(wrong)
