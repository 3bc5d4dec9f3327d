"""Checks for 05_sparse_optimizers: a row-wise Adagrad sharder, a combined optimizer, the optimizer-state formula."""
from __future__ import annotations

import math
import re
from typing import Any, Callable, Mapping

import torch

from course_lib import data
from course_lib.checks import (
    CheckFailed,
    builds_on,
    call_unchanged,
    checked_call,
    exercise,
    fail,
    judged_again,
    one_line,
    passed,
    raise_if_unwritten,
)

# A small world for the checks: the lab's tables, few rows (fast to make and to train on).
_CHECK_CONFIG = data.ClickLogConfig(num_train=2_000, num_test=200, seed=3)
_LEARNING_RATE = 0.05
_SECOND_LEARNING_RATE = 0.2  # a function must pass its argument on, not the first case's number


# ------------------------------------------------------------------------------------------ exercise 1


def _sharder_on_rank(make_sharder: Callable[[float], Any]) -> dict[str, Any]:
    """Runs on every rank: shard one table row-wise with the learner's sharder, train one step, report."""
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from course_lib import optimizers, sharding

    torch.manual_seed(0)
    tables = [EmbeddingBagConfig(name="t_check", embedding_dim=16, num_embeddings=1_000, feature_names=["f"])]
    try:
        sharder = call_unchanged("rowwise_adagrad_sharder", make_sharder, _LEARNING_RATE)
    except Exception as error:
        raise_if_unwritten(error)
        return {"error": f"rowwise_adagrad_sharder raised {one_line(error)}"}
    if not isinstance(sharder, EmbeddingBagCollectionSharder):
        return {"type": type(sharder).__name__}
    from course_lib.checks import KeptState

    try:
        try:
            second = call_unchanged("rowwise_adagrad_sharder", make_sharder, _SECOND_LEARNING_RATE)
        except KeptState:  # it changed the first sharder: said below, with the learning rates
            second = make_sharder(_SECOND_LEARNING_RATE)
        second_lr = (getattr(second, "fused_params", None) or {}).get("learning_rate")
        first_params = getattr(sharder, "fused_params", None)
        shared = second is not sharder and first_params is not None and first_params is getattr(second, "fused_params", None)
    except Exception as error:
        return {"error": f"rowwise_adagrad_sharder({_SECOND_LEARNING_RATE}) raised {one_line(error)}"}
    try:
        model = optimizers.row_wise_ebc(tables, sharder, kernel="fused")
        batch = sharding.random_batch(tables, 16, seed=0)
        optimizers.sum_of_squares(model(batch)).backward()
    except Exception as error:
        return {"error": f"sharding or training with your sharder raised {one_line(error)}"}
    return {
        "type": "EmbeddingBagCollectionSharder",
        "optimizer": str((getattr(sharder, "fused_params", None) or {}).get("optimizer")),
        "states": [(row["state"], row["local shape"]) for row in optimizers.state_rows(model.fused_optimizer)],
        "lr": [group["lr"] for group in model.fused_optimizer.param_groups],
        "second lr": second_lr,
        "shared params": shared,
    }


@exercise
def check_rowwise_sharder(
    rowwise_adagrad_sharder: Callable[[float], Any], launch: Callable[..., list[Any]] | None = None
) -> None:
    """`rowwise_adagrad_sharder(learning_rate)` must return an EmbeddingBagCollectionSharder whose fused
    optimizer is exact row-wise Adagrad at that learning rate.

    The check shards a 1,000 x 16 table row-wise over 2 ranks with it, trains one step, and reads the fused
    optimizer's state and learning rate, and which optimizer the sharder names (another one-value-per-row
    optimizer, such as EMAINPLACE_ROWWISE_ADAGRAD, has the same state shape but another update rule).
    """
    rows_per_rank = judge_rowwise_sharder(rowwise_adagrad_sharder, launch)
    passed(f"row-wise Adagrad, fused: one state value per row ({rows_per_rank} rows on rank 0), lr {_LEARNING_RATE}")


def judge_rowwise_sharder(rowwise_adagrad_sharder: Callable[[float], Any],
                          launch: Callable[..., list[Any]] | None = None) -> int:
    """Exercise 1's judgement (fails as its check fails; returns the rows on rank 0): exercise 4's check applies
    it again to the rowwise_adagrad_sharder a choose_sharder calls."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    if launch is None:
        from course_lib import launch
    report = launch(_sharder_on_rank, rowwise_adagrad_sharder, world_size=2, show_ranks=[])[0]
    if "error" in report:
        if "deprecated" in report["error"]:
            hint = "fbgemm deprecated ROWWISE_ADAGRAD (the inexact one): use EmbOptimType.EXACT_ROWWISE_ADAGRAD"
        elif re.search(r"Optimizer (exact_sgd|exact_adagrad|exact_row_wise_adagrad|ema_in_place_row_wise_adagrad) "
                       r"is not supported in CPU mode", report["error"]):
            # a name the CPU kernels fuse, refused: it came as a string, and fbgemm compares with the enum
            hint = ("fused_params['optimizer'] takes the enum, EmbOptimType.EXACT_ROWWISE_ADAGRAD, not its name as a "
                    "string: fbgemm compares it with the enum's members")
        elif "not supported in CPU mode" in report["error"] or "CPU" in report["error"]:
            hint = "fbgemm's CPU kernels fuse EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD and EMAINPLACE_ROWWISE_ADAGRAD only: use EXACT_ROWWISE_ADAGRAD"
        else:
            hint = "fused_params={'optimizer': EmbOptimType..., 'learning_rate': ...}: fbgemm's names, see section 2"
        fail(report["error"], hint)
    if report.get("type") != "EmbeddingBagCollectionSharder":
        fail(
            f"rowwise_adagrad_sharder returned a {report.get('type')}",
            "return EmbeddingBagCollectionSharder(fused_params={...}); DMP takes it in sharders=[...]",
        )
    states = report["states"]
    rows_per_rank = 500
    if not states:
        fail(
            "the fused optimizer keeps no state: that is SGD (fbgemm's default when fused_params name no optimizer)",
            "set fused_params['optimizer'] to EmbOptimType.EXACT_ROWWISE_ADAGRAD",
        )
    shapes = [shape for _, shape in states]
    if shapes == [(rows_per_rank, 16)]:
        fail(
            f"the fused optimizer keeps a {rows_per_rank} x 16 state on rank 0: one value per element, "
            "that is (per-element) Adagrad",
            "row-wise Adagrad keeps one value per row: EmbOptimType.EXACT_ROWWISE_ADAGRAD",
        )
    if shapes != [(rows_per_rank,)]:
        fail(
            f"the fused optimizer's states on rank 0 are {states}; row-wise Adagrad keeps one of shape ({rows_per_rank},)",
            "use EmbOptimType.EXACT_ROWWISE_ADAGRAD",
        )
    if report["optimizer"] != str(EmbOptimType.EXACT_ROWWISE_ADAGRAD):
        ema = report["optimizer"] == str(EmbOptimType.EMAINPLACE_ROWWISE_ADAGRAD)
        fail(
            f"the sharder's optimizer is {report['optimizer']}: it keeps one value per row too, but "
            + ("that value is a moving average of the squared gradients (EMA, updated in place), not Adagrad's sum "
               "of them: another update rule" if ema else "it is not exact row-wise Adagrad: another update rule"),
            "exact row-wise Adagrad is EmbOptimType.EXACT_ROWWISE_ADAGRAD",
        )
    lr = report["lr"][0]
    if report.get("shared params") and not math.isclose(lr, _LEARNING_RATE, rel_tol=1e-5):
        fail(
            f"rowwise_adagrad_sharder({_SECOND_LEARNING_RATE}) changed the learning rate of the sharder that "
            f"rowwise_adagrad_sharder({_LEARNING_RATE}) had returned (now {lr:.4g}): both sharders hold the same "
            "fused_params dict",
            "build a new fused_params dict in each call instead of updating one shared dict",
        )
    if not math.isclose(lr, _LEARNING_RATE, rel_tol=1e-5):
        hint = (
            "0.01 is fbgemm's default: pass the learning rate as fused_params['learning_rate']"
            if math.isclose(lr, 0.01, rel_tol=1e-5)
            else "pass the function's learning_rate argument as fused_params['learning_rate']"
        )
        fail(f"the fused optimizer's learning rate is {lr:.4g}, expected {_LEARNING_RATE}", hint)
    second_lr = report.get("second lr")
    if second_lr is None or not math.isclose(float(second_lr), _SECOND_LEARNING_RATE, rel_tol=1e-5):
        fail(
            f"rowwise_adagrad_sharder({_SECOND_LEARNING_RATE}) sets the learning rate to {second_lr}",
            "use the function's learning_rate argument, not a number typed in",
        )
    return rows_per_rank


# ------------------------------------------------------------------------------------------ exercise 2


# A second plan, with other tables data-parallel than the planner's (t_category and t_terms on 2 ranks): an
# answer that names the tables the lab printed, instead of asking the model which parameters are fused, fails it.
_OTHER_DATA_PARALLEL = ("t_user", "t_terms")
# A third plan, with one table sharded table-wise on the dense kernel: no fused optimizer updates it, though it is
# not data-parallel. An answer that takes "data-parallel in the plan" for "not fused" leaves it untrained.
_DENSE_KERNEL_TABLE = "t_item"


def _combined_on_rank(combined_optimizer: Callable[[Any, Any], Any]) -> list[dict[str, Any]]:
    """Runs on every rank: shard the lab's DLRM (fused Adagrad sharder) by the planner, then by a plan with other
    data-parallel tables, then by a plan with a table-wise table on the dense kernel; for each, build the
    learner's optimizer and step."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.sharding_plan import data_parallel, table_wise

    from course_lib import models, planning, training

    reports = []
    world_size = dist.get_world_size()
    for plan_index in range(3):
        torch.manual_seed(0)
        model = models.click_dlrm(_CHECK_CONFIG.tables(16), _CHECK_CONFIG.num_dense, device="meta")
        sharders = training.sharders()
        if plan_index == 0:
            plan = EmbeddingShardingPlanner(topology=planning.topology(world_size)).collective_plan(
                model, sharders, dist.GroupMember.WORLD
            )
        else:
            if plan_index == 1:
                per_table = {t.name: data_parallel() if t.name in _OTHER_DATA_PARALLEL
                             else table_wise(rank=i % world_size, compute_kernel="fused")
                             for i, t in enumerate(_CHECK_CONFIG.tables(16))}
            else:  # t_category data-parallel; t_item table-wise on rank 1, dense kernel; the others fused
                per_table = {"t_user": table_wise(rank=0, compute_kernel="fused"),
                             _DENSE_KERNEL_TABLE: table_wise(rank=1 % world_size, compute_kernel="dense"),
                             "t_category": data_parallel(),
                             "t_terms": table_wise(rank=0, compute_kernel="fused")}
            plan = training.model_plan(model, per_table, world_size)
        dmp = DistributedModelParallel(model, device=training.device(), plan=plan, sharders=sharders)
        reports.append(_combined_step(combined_optimizer, dmp))
        if "error" in reports[-1]:
            break
    return reports


def _combined_step(combined_optimizer: Callable[[Any, Any], Any], dmp: Any) -> dict[str, Any]:
    """The learner's optimizer for `dmp`, one training step with it, and what it changed and holds."""
    import torch.distributed as dist

    from course_lib import training

    fused_names = {name for name, _ in _fused_parameters(dmp)}
    made: list[Any] = []

    def make_dense(params: Any) -> Any:  # the dense optimizer the check asks for; it records that it was used
        optimizer = torch.optim.Adam(params, lr=_DENSE_LR)
        made.append(optimizer)
        return optimizer

    try:
        optimizer = combined_optimizer(dmp, make_dense)
    except Exception as error:
        raise_if_unwritten(error)
        return {"error": f"combined_optimizer raised {one_line(error)}"}
    others = {name: p.detach().clone() for name, p in dmp.named_parameters() if name not in fused_names and p.numel()}
    batch = next(data.batches(data.make_click_log(_CHECK_CONFIG).train, 64, dist.get_rank(), dist.get_world_size()))
    try:
        training.train_step(dmp, optimizer, batch)
        state = optimizer.state_dict()["state"]
    except Exception as error:
        return {"error": f"a training step with your optimizer raised {one_line(error)}"}
    state_names = {f"{key}/{name}" for key, value in state.items() if isinstance(value, Mapping) for name in value}
    fused_state = {f"{key}/{name}" for key, value in dmp.fused_optimizer.state_dict()["state"].items() for name in value}
    parameters = dict(dmp.named_parameters())
    return {
        "type": type(optimizer).__name__,
        "make dense calls": len(made),
        "missing fused state": sorted(fused_state - state_names),
        "not updated": sorted(
            name.replace("model.", "").replace("sparse_arch.embedding_bag_collection.embedding_bags.", "")
            for name, before in others.items()
            if torch.equal(before, parameters[name].detach())
        ),
    }


_DENSE_LR = 0.0123  # an unusual rate: an optimizer that does not come from make_dense shows itself


def _fused_parameters(model: Any) -> list[tuple[str, Any]]:
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    return list(in_backward_optimizer_filter(model.named_parameters(), include=True))


@exercise
def check_combined_optimizer(
    combined_optimizer: Callable[[Any, Any], Any], launch: Callable[..., list[Any]] | None = None
) -> None:
    """`combined_optimizer(model, make_dense)` must return one optimizer for a DMP model: its fused optimizer
    (which holds the tables' state) plus ``make_dense(params)`` over every parameter no fused kernel updates.

    The check shards the lab's DLRM with the course's fused Adagrad sharder on 2 ranks (two tables fused
    table-wise, two data-parallel), trains one step with Adam as the dense optimizer, and reads what changed
    and what the optimizer's ``state_dict`` holds; then again with a plan where other tables are data-parallel,
    and with a plan where one table is sharded table-wise on the dense kernel (not data-parallel, not fused).
    """
    if launch is None:
        from course_lib import launch
    per_rank = launch(_combined_on_rank, combined_optimizer, world_size=2, show_ranks=[])
    for index in range(max(len(reports) for reports in per_rank)):
        reports = [rank_reports[index] for rank_reports in per_rank if index < len(rank_reports)]
        where = ["", f"with another plan ({' and '.join(_OTHER_DATA_PARALLEL)} data-parallel, the other tables fused), ",
                 f"with a plan where {_DENSE_KERNEL_TABLE} is sharded table-wise on the dense kernel (no fused "
                 "optimizer updates it, though it is not data-parallel), "][index]
        generic = ["",
                   "; ask the model which parameters a fused kernel updates (in_backward_optimizer_filter), rather "
                   "than naming the tables or layers the lab's plan printed",
                   "; a table's sharding type (data-parallel or not) does not say whether it is fused: its compute "
                   "kernel does, so ask the model (in_backward_optimizer_filter) rather than the plan"][index]
        _judge_combined(reports, where, generic)
    passed(
        f"one {per_rank[0][0]['type']}: the fused tables' state is in its state_dict, and every other parameter "
        "(dense layers, data-parallel tables, a table sharded on the dense kernel) steps with the dense optimizer"
    )


def _judge_combined(reports: list[dict[str, Any]], where: str, generic: str) -> None:
    """Fail with what is wrong in the ranks' `reports` of one plan; `where` and `generic` name that plan."""
    for report in reports:
        if "error" in report:
            message = report["error"]
            hint = (
                "a parameter may be in one optimizer only: give make_dense the parameters that "
                "in_backward_optimizer_filter(model.named_parameters()) lets through"
                if "Duplicate param key" in message
                else "CombinedOptimizer([model.fused_optimizer, KeyedOptimizerWrapper(params, make_dense)])"
            )
            fail(where + message, hint + generic)
    for rank, report in enumerate(reports):
        if report["make dense calls"] == 0:
            fail(
                where + "combined_optimizer never called make_dense: the dense part steps with an optimizer the "
                "caller did not ask for",
                "build the dense optimizer with the make_dense you are given: KeyedOptimizerWrapper(params, make_dense)",
            )
        if report["missing fused state"]:
            fail(
                f"{where}the optimizer's state_dict on rank {rank} lacks the fused tables' state "
                f"({', '.join(report['missing fused state'])}): a checkpoint of it would lose it",
                "the fused state lives in model.fused_optimizer (torchrec #2104): put it in the CombinedOptimizer",
            )
        if report["not updated"]:
            fail(
                f"{where}one step left these parameters unchanged on rank {rank}: {', '.join(report['not updated'])}",
                "every parameter that no fused kernel updates (data-parallel tables too) needs the dense "
                "optimizer: in_backward_optimizer_filter(model.named_parameters())" + generic,
            )


# ------------------------------------------------------------------------------------------ exercise 3

SHARDINGS = ("row_wise", "column_wise", "table_wise")
_CHECK_WORLD = 3  # the check measures on 3 ranks: rows that do not divide, a last rank with fewer or none
# (num_rows, embedding_dim, sharding) measured by fbgemm on _CHECK_WORLD ranks, for each optimizer: 10 rows give
# 4, 4, 2; 4 rows give 2, 2, 0; 24 columns give three shards of 8 columns that each hold every row
_MEASURED_CASES = ((10, 12, "row_wise"), (4, 12, "row_wise"), (1_000, 24, "column_wise"), (10, 12, "table_wise"))
# sizes the check does not measure (the formula that the tests prove against measurements): other world sizes
_EXTRA_CASES = ((1_001, 32, 4, "row_wise"), (5, 8, 8, "row_wise"), (4_096, 64, 8, "column_wise"),
                (30_000, 128, 4, "column_wise"), (4_096, 8, 4, "table_wise"))


def _rows_on_ranks(num_rows: int, world_size: int) -> list[int]:
    """torchrec's row-wise split: blocks of ceil(num_rows / world_size) rows in rank order, the rest to the last."""
    block = -(-num_rows // world_size)
    return [max(0, min(block, num_rows - rank * block)) for rank in range(world_size)]


def _values_per_row(optimizer: Any, columns: int) -> int:
    return {"exact_sgd": 0, "exact_adagrad": columns, "exact_row_wise_adagrad": 1}[str(optimizer)]


def _state_bytes(num_rows: int, embedding_dim: int, world_size: int, optimizer: Any, sharding: str) -> list[int]:
    """The answer: the fp32 state of the fused optimizer on each rank, for one table sharded by `sharding`."""
    if sharding == "row_wise":
        rows, columns = _rows_on_ranks(num_rows, world_size), embedding_dim
    elif sharding == "column_wise":  # every rank a shard of embedding_dim / world_size columns, with every row
        rows, columns = [num_rows] * world_size, embedding_dim // world_size
    else:  # table_wise: the whole table on rank 0
        rows, columns = [num_rows] + [0] * (world_size - 1), embedding_dim
    return [r * _values_per_row(optimizer, columns) * 4 for r in rows]


def measure_state_bytes(cases: list[tuple[int, int, str, Any]]) -> list[int]:
    """On every rank: for each (num_rows, embedding_dim, sharding, optimizer), one table sharded that way over all
    ranks on the fused kernel (table-wise on rank 0), and the bytes of fused optimizer state this rank holds."""
    import torch.distributed as dist
    from torchrec import EmbeddingBagConfig
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.sharding_plan import column_wise, row_wise, table_wise

    from course_lib import optimizers, planning, training

    world_size = dist.get_world_size()
    held = []
    for num_rows, dim, sharding, optimizer in cases:
        tables = [EmbeddingBagConfig(name="t_state", embedding_dim=dim, num_embeddings=num_rows, feature_names=["f"])]
        generator = {"row_wise": row_wise(compute_kernel="fused"), "table_wise": table_wise(rank=0, compute_kernel="fused"),
                     "column_wise": column_wise(ranks=list(range(world_size)), compute_kernel="fused")}[sharding]
        sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": optimizer, "learning_rate": 0.1})
        plan = planning.hand_plan(tables, {"t_state": generator}, world_size=world_size, sharder=sharder)
        model = DistributedModelParallel(planning.meta_ebc(tables), device=training.device(), plan=plan, sharders=[sharder])
        held.append(optimizers.state_bytes(model.fused_optimizer))
    return held


def _is_int(value: Any) -> bool:
    """An integer (Python's or NumPy's), not a bool, a float or a string."""
    import numbers

    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _diagnose(got: list[int], rows: int, dim: int, ranks: int, optimizer: Any, sharding: str) -> str:
    """A hint for a wrong answer: which usual mistake gives exactly `got` for this case."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    want = _state_bytes(rows, dim, ranks, optimizer, sharding)
    name = str(optimizer)
    as_row_wise = _state_bytes(rows, dim, ranks, optimizer, "row_wise")
    weights = _state_bytes(rows, dim, ranks, EmbOptimType.EXACT_ADAGRAD, sharding)  # as large as Adagrad's state
    if name == "exact_sgd":
        return "plain SGD keeps no state at all (no momentum; and the table's weights are not optimizer state)"
    if got == [w // 4 for w in want] and any(want):
        return "that counts values; each fp32 value takes 4 bytes"
    if got == [w // 2 for w in want] and any(want):
        return "the state is fp32 (4 bytes a value), even where tables are fp16"
    if name == "exact_adagrad" and got == [2 * w for w in want] and any(want):
        return ("twice Adagrad's state: Adagrad keeps one sum of squared gradients per element (two states is Adam; "
                "and the table's weights are not optimizer state)")
    if got == [s + w for s, w in zip(want, weights)]:
        return "that counts the table's weights too; the question is the optimizer's state alone"
    if dim != 16 and got == _state_bytes(rows, 16, ranks, optimizer, sharding):
        return "use the embedding_dim argument: 16 is the lab's table, not every table"
    if name == "exact_row_wise_adagrad":
        per_element = _state_bytes(rows, dim, ranks, EmbOptimType.EXACT_ADAGRAD, sharding)
        if got == per_element:
            return "row-wise Adagrad keeps one value per row, not one per element"
        if got == [b // 16 for b in per_element]:
            return ("row-wise Adagrad keeps one value per row: 1/embedding_dim of Adagrad's state, which is 1/16 only "
                    "for the lab's 16-wide table")
    if name == "exact_adagrad" and got == [b // dim for b in want]:
        return "(per-element) Adagrad keeps one value per element: rows x columns"
    if sharding == "row_wise":
        even = [rows // ranks * _values_per_row(optimizer, dim) * 4] * ranks
        block = [-(-rows // ranks) * _values_per_row(optimizer, dim) * 4] * ranks
        if got == even:
            return ("num_rows // world_size is right only when the rows divide: torchrec gives the ranks blocks of "
                    "ceil(num_rows / world_size) rows in rank order, and the last ranks what is left")
        if got == block:
            return "the last ranks hold what is left of the rows after the full blocks, possibly none: not a full block"
    if sharding == "column_wise":
        if name == "exact_row_wise_adagrad" and all(g < rows * 4 for g in got):
            return ("each column shard is a table of its own for fbgemm, with every row: row-wise Adagrad keeps one "
                    "value per row in every shard, so each rank keeps num_rows values, however few its columns")
        if got == as_row_wise:
            return ("column-wise is not row-wise: every rank holds every row, and embedding_dim / world_size of the "
                    "columns")
        if name == "exact_adagrad" and got == [rows * dim * 4] * ranks:
            return "each rank holds embedding_dim / world_size of the columns, and Adagrad's state for those only"
    if sharding == "table_wise":
        if got == as_row_wise or got == [want[0] // ranks] * ranks:
            return "table-wise does not split the table: it lives whole on rank 0, and the other ranks hold none of it"
        if got == [want[0]] * ranks:
            return "table-wise places the table on rank 0 only: the other ranks hold no part of it, and no state"
    return ("bytes on a rank = (rows it holds) x (state values per row of its shard) x 4; the rows and columns a "
            "rank holds depend on the sharding")


def _judge_state_bytes(state_bytes_per_rank: Callable[..., Any],
                       cases: list[tuple[int, int, int, Any, str, list[int] | None]]) -> None:
    """Fail at the first case (rows, dim, ranks, optimizer, sharding, measured bytes per rank or None) where the
    answer is not the bytes on each rank (measured, or else the formula's)."""
    for rows, dim, ranks, optimizer, sharding, seen in cases:
        want = seen if seen is not None else _state_bytes(rows, dim, ranks, optimizer, sharding)
        call = f"state_bytes_per_rank({rows:,}, {dim}, {ranks}, {optimizer.name}, {sharding!r})"
        try:
            answer = checked_call("state_bytes_per_rank", state_bytes_per_rank, rows, dim, ranks, optimizer, sharding)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"{call} raised {one_line(error)}",
                 "the check asks for every sharding of " + ", ".join(SHARDINGS) + ", and for world sizes other than 2")
        if not isinstance(answer, (list, tuple)) or len(answer) != ranks:
            fail(f"{call} returned {answer!r}: expected a list of {ranks} byte counts, one per rank",
                 "ranks can hold different amounts of state: return [bytes on rank 0, bytes on rank 1, ...]")
        wrong_type = next((value for value in answer if not _is_int(value)), None)
        if wrong_type is not None:
            fail(f"{call} returned {answer!r}, with {wrong_type!r}, a {type(wrong_type).__name__}: a byte count is a "
                 "whole number, and the caller sizes buffers and budgets with it",
                 "num_rows / world_size is a float (a fraction of a row when they do not divide): count whole rows "
                 "with integer arithmetic (// and math.ceil)")
        got = [int(value) for value in answer]
        if got == want:
            continue
        source = "fbgemm measured" if seen is not None else "expected"
        fail(f"{call} = {got}; {source} {want}", _diagnose(got, rows, dim, ranks, optimizer, sharding))


@exercise
def check_state_bytes(
    state_bytes_per_rank: Callable[..., Any],
    measured: Mapping[Any, int],
    num_rows: int,
    embedding_dim: int,
    world_size: int,
    launch: Callable[..., list[Any]] | None = None,
) -> None:
    """`state_bytes_per_rank(num_rows, embedding_dim, world_size, optimizer, sharding)` must return the bytes
    of fused optimizer state on each rank (a list of `world_size` ints) for one table sharded by `sharding`:
    ``"row_wise"`` (blocks of ceil(num_rows / world_size) rows), ``"column_wise"`` (embedding_dim / world_size
    columns a rank, every row) or ``"table_wise"`` (the whole table on rank 0).

    `measured` maps each EmbOptimType measured in section 4 to the bytes rank 0 held for a `num_rows` x
    `embedding_dim` table sharded row-wise on `world_size` ranks. The check compares the answer with it, then
    measures fbgemm's state on 3 ranks for tables the lab has not shown (rows that do not divide, column-wise,
    table-wise) and compares each rank's bytes, then tries other sizes and world sizes.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    from course_lib.checks import launch_quietly

    optimizer_types = [EmbOptimType.EXACT_SGD, EmbOptimType.EXACT_ADAGRAD, EmbOptimType.EXACT_ROWWISE_ADAGRAD]
    for optimizer in optimizer_types:
        lab = _state_bytes(num_rows, embedding_dim, world_size, optimizer, "row_wise")[0]
        if optimizer in measured and measured[optimizer] != lab:
            fail(f"the measurement for {optimizer.name} ({measured[optimizer]:,} bytes) is not the one section 4 made",
                 "pass the dictionary that section 4 built from its measurement")
    lab_cases = [(num_rows, embedding_dim, world_size, o, "row_wise",
                  [measured[o]] * world_size if o in measured else None) for o in optimizer_types]
    _judge_state_bytes(state_bytes_per_rank, lab_cases)  # the lab's case first: no launch for a first slip
    if launch is None:
        from course_lib import launch
    fresh = [(rows, dim, sharding, o) for rows, dim, sharding in _MEASURED_CASES for o in optimizer_types]
    per_rank = launch_quietly(launch, measure_state_bytes, fresh, world_size=_CHECK_WORLD, timeout=120)
    _judge_state_bytes(state_bytes_per_rank, [(rows, dim, _CHECK_WORLD, o, sharding, [held[i] for held in per_rank])
                                              for i, (rows, dim, sharding, o) in enumerate(fresh)])
    _judge_state_bytes(state_bytes_per_rank, [(r, d, w, o, s, None) for r, d, w, s in _EXTRA_CASES
                                              for o in optimizer_types])
    passed(
        f"the formula matches section 4's measurement, fbgemm's state on {_CHECK_WORLD} ranks for rows that do not "
        "divide, column-wise and table-wise tables, and other sizes"
    )


# ------------------------------------------------------------------------------------------ exercise 4

BUDGET_FRACTION = 1 / 8  # the lab's budget: optimizer state may take at most this share of a rank's table bytes
UNSHOWN_BUDGET_FRACTION = 1 / 32  # a budget the lab does not show: the check applies the learner's choice to it too
BUDGET_CASES = (BUDGET_FRACTION, UNSHOWN_BUDGET_FRACTION)
# Budgets the check asks choose_sharder about without training: row-wise Adagrad's 1/16 just over (1/18), just
# within (1/16), and room for anything (1). A cut-off typed in between the trained budgets fails one of them.
UNTRAINED_BUDGETS = (1 / 18, 1 / 16, 1.0)
# Each CPU-fused optimizer's state as a share of a 16-wide fp32 table (section 4's table); others are measured.
_STATE_SHARES = {"exact_sgd": 0.0, "exact_adagrad": 1.0, "exact_row_wise_adagrad": 1 / 16,
                 "ema_in_place_row_wise_adagrad": 1 / 16}
AUC_MARGIN = 0.01  # ... and the model must come within this of the AUC that exact (per-element) Adagrad reaches
BUDGET_LOG = data.ClickLogConfig(num_train=60_000, num_test=10_000, seed=5)


def _fraction(budget: float) -> str:
    from fractions import Fraction

    return str(Fraction(budget).limit_denominator(1_000))


def train_with_sharder(sharder: Any, config: data.ClickLogConfig = BUDGET_LOG) -> dict[str, Any]:
    """On every rank: the lab's DLRM sharded by the planner with `sharder`, one epoch of `config`'s log at
    256 rows per rank per step, then ``{"auc", "state bytes", "table bytes"}``: the test AUC of all ranks,
    this rank's fused optimizer state and the bytes of the fused tables it holds, and those tables' names."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.optim.optimizers import in_backward_optimizer_filter

    from course_lib import memory, models, optimizers, planning, training

    log = data.make_click_log(config)
    torch.manual_seed(0)
    model = models.click_dlrm(log.tables(16), config.num_dense, device="meta")
    plan = EmbeddingShardingPlanner(topology=planning.topology(dist.get_world_size())).collective_plan(
        model, [sharder], dist.GroupMember.WORLD
    )
    dmp = DistributedModelParallel(model, device=training.device(), plan=plan, sharders=[sharder])
    training.train(dmp, training.optimizer(dmp), log.train, 256, 1, desc=None)
    logits, labels = training.predict(dmp, log.test)
    fused_named = list(in_backward_optimizer_filter(dmp.named_parameters(), include=True))
    fused = [p for _, p in fused_named]
    return {
        "fused tables": sorted(name.rsplit(".", 2)[-2] for name, _ in fused_named),
        "auc": training.auc(logits, labels),
        "state bytes": optimizers.state_bytes(dmp.fused_optimizer),
        "table bytes": sum(memory.tensor_bytes(p) for p in fused),
    }


def _budget_on_rank(choose_sharder: Callable[[float], Any], budgets: tuple[float, ...]) -> dict[str, Any]:
    """On every rank: for each budget, the learner's sharder and what training with it gave; then exact Adagrad's."""
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    cases: list[dict[str, Any]] = []
    for budget in budgets:
        call = f"choose_sharder({_fraction(budget)})"
        try:
            sharder = call_unchanged("choose_sharder", choose_sharder, budget)
        except Exception as error:
            raise_if_unwritten(error)
            cases.append({"call": call, "error": f"{call} raised {one_line(error)}"})
            break
        if not isinstance(sharder, EmbeddingBagCollectionSharder):
            cases.append({"call": call, "type": type(sharder).__name__})
            break
        params = dict(getattr(sharder, "fused_params", None) or {})
        report: dict[str, Any] = {"call": call, "budget": budget, "type": "EmbeddingBagCollectionSharder",
                                  "optimizer": str(params.get("optimizer", "exact_sgd")), "lr": params.get("learning_rate", 0.01)}
        cases.append(report)
        try:
            report["yours"] = train_with_sharder(sharder)
        except Exception as error:
            report["error"] = f"{call}: training with your sharder raised {one_line(error)}"
            break
    adagrad = EmbeddingBagCollectionSharder(
        fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": 0.1}
    )
    trained = all("yours" in case for case in cases)
    return {"cases": cases, "adagrad": train_with_sharder(adagrad) if trained else None}


def _share_on_rank(sharders: list[Any]) -> list[Any]:
    """On every rank: for each sharder, its fused optimizer's state as a share of the bytes of the 16-wide table
    it holds (a 1,000-row table sharded row-wise, not trained), or the error it raised (a string)."""
    from torchrec import EmbeddingBagConfig

    from course_lib import memory, optimizers

    tables = [EmbeddingBagConfig(name="t_share", embedding_dim=16, num_embeddings=1_000, feature_names=["f"])]
    shares: list[Any] = []
    for sharder in sharders:
        try:
            model = optimizers.row_wise_ebc(tables, sharder, kernel="fused")
            table_bytes = sum(memory.tensor_bytes(p) for _, p in _fused_parameters(model))
            shares.append(optimizers.state_bytes(model.fused_optimizer) / table_bytes)
        except Exception as error:
            shares.append(f"sharding with it raised {one_line(error)}")
    return shares


def _check_untrained_budgets(choose_sharder: Callable[[float], Any], launch: Callable[..., list[Any]]) -> None:
    """Fail if `choose_sharder` returns, for a budget of ``UNTRAINED_BUDGETS``, an optimizer whose state share of
    16-wide tables is over that budget (known shares from ``_STATE_SHARES``, others measured without training)."""
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    chosen: list[tuple[str, float, Any, str]] = []
    for budget in UNTRAINED_BUDGETS:
        call = f"choose_sharder({_fraction(budget)})"
        try:
            sharder = checked_call("choose_sharder", choose_sharder, budget)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"{call} raised {one_line(error)}", "return a sharder for every budget: the check asks for budgets "
                 "the lab does not show")
        if not isinstance(sharder, EmbeddingBagCollectionSharder):
            fail(f"{call} returned a {type(sharder).__name__}", "return one EmbeddingBagCollectionSharder (as in exercise 1)")
        params = dict(getattr(sharder, "fused_params", None) or {})
        chosen.append((call, budget, sharder, str(params.get("optimizer", "exact_sgd"))))
    unknown = [sharder for _, _, sharder, name in chosen if name not in _STATE_SHARES]
    measured = iter(launch(_share_on_rank, unknown, world_size=2, show_ranks=[])[0] if unknown else [])
    for call, budget, _, name in chosen:
        share = _STATE_SHARES[name] if name in _STATE_SHARES else next(measured)
        if isinstance(share, str):
            fail(f"{call}: {share}", "fbgemm's CPU kernels fuse EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD and "
                 "EMAINPLACE_ROWWISE_ADAGRAD only (section 4)")
        if share > budget + 1e-12:
            fail(
                f"{call}: {name} keeps {_fraction(share)} ({share:.1%}) of the table bytes as state; the budget is "
                f"{_fraction(budget)} ({budget:.1%}), so this job would not fit its memory (the check trains only "
                f"at {' and '.join(_fraction(b) for b in BUDGET_CASES)}, and asks about other budgets too)",
                "compare each option's share with the budget you are given (row-wise Adagrad keeps one value per row: "
                "1/dim, 1/16 here), rather than a cut-off that only separates the lab's two budgets",
            )


@exercise
def check_budget_choice(choose_sharder: Callable[[float], Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """`choose_sharder(budget_fraction)` must return an EmbeddingBagCollectionSharder whose fused optimizer keeps
    at most `budget_fraction` of each rank's table bytes as state and trains the lab's DLRM, in one epoch of a
    click log of the check's own, to within ``AUC_MARGIN`` of the AUC that exact Adagrad (lr 0.1) reaches; for
    the lab's budget (``BUDGET_FRACTION``) and for one it does not show (``UNSHOWN_BUDGET_FRACTION``), where
    row-wise Adagrad's state (1/16 of 16-wide tables) does not fit. Every table that exact Adagrad's sharder gets
    fused must be fused with the answer's too: a table moved to the dense kernel takes its state to the dense
    optimizer (``training.optimizer``'s Adam), outside the fused state the budget is measured on. Then, without
    training, it asks for ``UNTRAINED_BUDGETS`` too (1/18, where row-wise Adagrad does not fit, 1/16 and 1), and
    compares each choice's state share of the tables with its budget.
    """
    if launch is None:
        from course_lib import launch
    earlier = builds_on(choose_sharder, "rowwise_adagrad_sharder")  # exercise 1's answer: its mistakes fail here too
    if earlier is not None:
        judged_again("exercise 1", judge_rowwise_sharder, earlier, launch, by="choose_sharder")
    reports = launch(_budget_on_rank, choose_sharder, BUDGET_CASES, world_size=2, show_ranks=[])
    reference = reports[0]["adagrad"]
    for report in reports[0]["cases"]:  # every budget's errors first: one that raised left no reference run
        call = report["call"]
        if "type" not in report:
            fail(report["error"], "return EmbeddingBagCollectionSharder(fused_params={'optimizer': ..., 'learning_rate': ...})")
        if report["type"] != "EmbeddingBagCollectionSharder":
            fail(f"{call} returned a {report['type']}", "return one EmbeddingBagCollectionSharder (as in exercise 1)")
        if "error" in report:
            hint = (
                "fbgemm's CPU kernels fuse EXACT_SGD, EXACT_ADAGRAD, EXACT_ROWWISE_ADAGRAD and EMAINPLACE_ROWWISE_ADAGRAD only (section 4)"
                if "CPU" in report["error"] or "deprecated" in report["error"]
                else "fused_params={'optimizer': EmbOptimType..., 'learning_rate': ...}"
            )
            fail(report["error"], hint)
    for i, report in enumerate(reports[0]["cases"]):
        call, budget = report["call"], report["budget"]
        if reference is not None:
            unfused = sorted(set(reference["fused tables"]) - set(report["yours"]["fused tables"]))
            if unfused:
                fail(
                    f"{call}: with your sharder the tables {unfused} are no longer fused: they train on the dense "
                    "kernel, and training.optimizer gives them Adam, two fp32 values per element of state kept "
                    "outside the fused optimizer, where the budget still counts them",
                    "the budget is met by the fused optimizer's own state: keep the sharder's fused kernels (an "
                    "EmbeddingBagCollectionSharder with fused_params) and choose its optimizer",
                )
        if any(not r["cases"][i]["yours"]["table bytes"] for r in reports):
            fail(f"{call}: no table is fused on some rank with your sharder, so no fused state can be measured",
                 "return EmbeddingBagCollectionSharder(fused_params={'optimizer': ..., 'learning_rate': ...})")
        worst = max(r["cases"][i]["yours"]["state bytes"] / r["cases"][i]["yours"]["table bytes"] for r in reports)
        if worst > budget:
            fail(
                f"{call}: {report['optimizer']} keeps {worst:.1%} of the table bytes as state on a rank; the budget is "
                f"{_fraction(budget)} ({budget:.1%}), so this job would not fit its memory",
                "each option's state as a share of the tables: exact Adagrad all of it, row-wise Adagrad one value per "
                "row (1/dim), SGD none (section 4's table): return one whose share fits the budget you are given",
            )
        auc = report["yours"]["auc"]
        if reference is not None and auc < reference["auc"] - AUC_MARGIN:
            hint = (
                "exact SGD keeps no state, but one global learning rate moves the sparse rows slowly: at this rate "
                "the tables barely train in one epoch. Measure larger rates (lab05.train_with_sharder), or take an "
                "adaptive optimizer where the budget has room for its state"
                if "sgd" in report["optimizer"]
                else "the learning rate: try a few (0.01 to 0.5) and keep the best"
            )
            fail(
                f"{call}: {report['optimizer']} at lr {report['lr']:g} reaches AUC {auc:.4f} in one epoch; exact "
                f"Adagrad reaches {reference['auc']:.4f}, and the goal is within {AUC_MARGIN}: this model ranks clicks "
                "measurably worse",
                hint,
            )
    _check_untrained_budgets(choose_sharder, launch)
    chosen = "; ".join(f"{_fraction(r['budget'])}: {r['optimizer']} at lr {r['lr']:g}" for r in reports[0]["cases"])
    untrained = ", ".join(_fraction(b) for b in UNTRAINED_BUDGETS)
    passed(
        f"for budgets {chosen}: state within each budget's share of the table bytes, and AUC within {AUC_MARGIN} of "
        f"exact Adagrad's; the choices for {untrained} fit their budgets too"
    )
