"""Checks for 04_dmp: plan and wrap a model with two EBCs, write the training step, compute the AUC gap."""
from __future__ import annotations

import copy
import itertools
import math
from typing import Any, Callable, NoReturn

import torch

from course_lib import data, training
from course_lib.checks import CheckFailed, checked_call, exercise, fail, one_line, passed, raise_if_unwritten

# A small world for the checks: the same tables as the lab's log, few rows (fast to make and to train on).
_CHECK_CONFIG = data.ClickLogConfig(num_train=2_000, num_test=2_000, seed=3)

# ------------------------------------------------------------------------------------------ exercise 1


def two_tower(device: str | torch.device = "meta") -> torch.nn.Module:
    """A model the lab has not shown: a query tower and a candidate tower, each with its own EBC.

    Neither EBC sits at the DLRM's ``sparse_arch.embedding_bag_collection``: they are
    ``query_tower.embeddings`` (tables ``t_user``, ``t_query``) and ``candidate_tower.embeddings``
    (``t_item``, ``t_brand``). ``forward(query, candidate, labels)`` returns the BCE loss of the towers' dot product.
    """
    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig

    class Tower(torch.nn.Module):
        def __init__(self, tables: list[tuple[str, int]]) -> None:
            super().__init__()
            configs = [EmbeddingBagConfig(name=name, embedding_dim=8, num_embeddings=rows, feature_names=[name[2:]])
                       for name, rows in tables]
            self.embeddings = EmbeddingBagCollection(configs, device=device)
            self.projection = torch.nn.Linear(8 * len(tables), 8, device=device)

        def forward(self, features: Any) -> torch.Tensor:
            return self.projection(self.embeddings(features).values())

    class TwoTower(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.query_tower = Tower([("t_user", 60), ("t_query", 24)])
            self.candidate_tower = Tower([("t_item", 40), ("t_brand", 12)])

        def forward(self, query: Any, candidate: Any, labels: torch.Tensor) -> torch.Tensor:
            logits = (self.query_tower(query) * self.candidate_tower(candidate)).sum(-1)
            return torch.nn.functional.binary_cross_entropy_with_logits(logits, labels)

    return TwoTower()


# The check's shardings of the two towers' tables: on 2 ranks, then on 3 (a plan written for 2 ranks fails there).
_TOWER_TABLES = {"query_tower.embeddings": ("t_user", "t_query"), "candidate_tower.embeddings": ("t_item", "t_brand")}


def _tower_per_table(world_size: int) -> dict[str, Any]:
    from torchrec.distributed.sharding_plan import column_wise, data_parallel, row_wise, table_wise

    if world_size == 2:
        return {"t_user": row_wise(compute_kernel="fused"), "t_query": data_parallel(),
                "t_item": table_wise(rank=1, compute_kernel="fused"), "t_brand": column_wise(ranks=[0, 1], compute_kernel="fused")}
    return {"t_user": row_wise(compute_kernel="fused"), "t_query": table_wise(rank=2, compute_kernel="fused"),
            "t_item": data_parallel(), "t_brand": column_wise(ranks=[1, 2], compute_kernel="fused")}


def _planned(plan: Any) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {
        table: (sharding.sharding_type, tuple(sharding.ranks or ()))
        for module_plan in plan.plan.values()
        for table, sharding in module_plan.items()
    }


def _tower_batch(rank: int, rows: int = 16) -> tuple[Any, Any, torch.Tensor]:
    """A small batch for the two towers, different on every rank: one id per feature per row."""
    from torchrec import KeyedJaggedTensor

    generator = torch.Generator().manual_seed(rank)

    def ids(features: dict[str, int]) -> Any:
        values = torch.cat([torch.randint(rows_of, (rows,), generator=generator) for rows_of in features.values()])
        return KeyedJaggedTensor(keys=list(features), values=values, lengths=torch.ones(rows * len(features), dtype=torch.int64))

    labels = torch.randint(2, (rows,), generator=generator).float()
    return ids({"user": 60, "query": 24}), ids({"item": 40, "brand": 12}), labels


def _wrap_on_rank(wrap: Callable[[Any, Any], Any], world_size: int) -> dict[str, Any]:
    """Runs on every rank: build the two towers on meta, let `wrap` shard them with the check's per_table, report.

    An error in `wrap` is not caught here: it may happen on some ranks only (a plan for 2 ranks, run on 3), and
    the other ranks would wait for them in a collective. The launch reports it.
    """
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel

    from course_lib import optimizers, training

    torch.manual_seed(0)
    requested = {table: _sharding_of(generator, table) for table, generator in _tower_per_table(world_size).items()}
    wrapped = wrap(two_tower(), _tower_per_table(world_size))
    report: dict[str, Any] = {"requested": requested, "type": type(wrapped).__name__}
    if not isinstance(wrapped, DistributedModelParallel):
        return report
    report["plan paths"] = sorted(wrapped.plan.plan) if getattr(wrapped, "plan", None) is not None else []
    report["actual"] = training.sharding_types(wrapped)
    report["replicas"] = type(getattr(wrapped, "_dmp_wrapped_module", None)).__name__
    fused = getattr(wrapped, "fused_optimizer", None)
    if fused is not None:
        rows = optimizers.state_rows(fused)
        report["fused states"] = sorted({row["state"].split(".")[-1] for row in rows})
        report["fused lr"] = sorted({group["lr"] for group in fused.param_groups})
        report["row-wise states"] = sorted({row["state"] for row in rows if len(row["local shape"]) == 1})
    names = {name for name, _ in wrapped.module.named_modules()}
    report["whole_model"] = {"query_tower.projection", "candidate_tower.projection"} <= names
    if report["whole_model"] and report["actual"] == requested:
        try:  # it must also train: one step on a small batch
            optimizer = training.optimizer(wrapped)
            loss = wrapped(*_tower_batch(dist.get_rank()))
            loss.backward()
            optimizer.step()
            report["loss"] = float(loss)
        except Exception as error:  # noqa: BLE001  (the learner's model: report it)
            report["error"] = f"one training step of the wrapped model raised {one_line(error)}"
    return report


def _sharding_of(generator: Any, table: str) -> tuple[str, tuple[int, ...]]:
    """What a ParameterShardingGenerator asks for `table` of the two towers, in this process's world."""
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    rows = {"t_user": 60, "t_query": 24, "t_item": 40, "t_brand": 12}[table]
    world_size = dist.get_world_size()
    sharding = generator(torch.empty(rows, 8, device="meta"), world_size, world_size, "cpu", EmbeddingBagCollectionSharder())
    return sharding.sharding_type, tuple(sharding.ranks or ())


def _wrap_failed(error: Any, world_size: int) -> NoReturn:
    first = error.failures[0] if error.failures else None
    text = f"{first.exc_type}: {first.message}" if first is not None and first.kind == "raised" else ""
    headline = first.headline() if first is not None else error.summary
    problem = f"on {world_size} ranks, wrap(model, per_table) failed: {headline}"
    if "model_plan expects one EmbeddingBagCollection" in text:
        hint = ("training.model_plan plans a model with one EBC; the check's model has two: build one entry "
                "per EBC with construct_module_sharding_plan, each under its own path")
    elif "sparse_arch" in text:
        hint = ("the check's model is not the DLRM: find its EBCs where they are, "
                "[(path, m) for path, m in model.named_modules() if isinstance(m, EmbeddingBagCollection)]")
    elif "per_param_sharding_config doesn't match" in text:
        hint = "give each EBC only its own tables: {name: per_table[name] for name in ebc.embedding_bags}"
    elif world_size == 3:
        hint = ("it passed on 2 ranks: was the plan written for 2? Let construct_module_sharding_plan take the "
                "world size from the process group (its default), or pass dist.get_world_size()")
    else:
        hint = "read the remote traceback: " + (text.splitlines()[0][:200] if text else error.summary)
    raise CheckFailed(problem, hint) from error


@exercise
def check_wrap(wrap: Callable[[Any, Any], Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """`wrap(model, per_table)` must plan every EBC of `model` from `per_table`, each at its own path, and
    return a DistributedModelParallel of the whole model that applies that plan with the course's sharders.

    The check runs it on 2 ranks, then on 3, with a two-tower model the lab has not shown: two EBCs, at
    ``query_tower.embeddings`` and ``candidate_tower.embeddings``; it reads back how each table was sharded.
    """
    from course_lib.checks import launch_quietly
    from course_lib.launcher.launch import LaunchError

    if launch is None:
        from course_lib import launch
    for world_size in (2, 3):
        try:
            report = launch_quietly(launch, _wrap_on_rank, wrap, world_size, world_size=world_size, timeout=120)[0]
        except LaunchError as error:
            _wrap_failed(error, world_size)
        _judge_wrap(report, world_size)
    passed("wrap plans both towers' EBCs at their own paths and applies the plan on 2 and 3 ranks: "
           + ", ".join(f"{t} {s}" for t, (s, _) in report["requested"].items()))


def _judge_wrap(report: dict[str, Any], world_size: int) -> None:
    on = f"on {world_size} ranks, "
    if report.get("type") != "DistributedModelParallel":
        fail(
            f"wrap returned a {report.get('type')}",
            "return DistributedModelParallel(module=model, device=..., plan=your_plan, sharders=...)",
        )
    if not report["whole_model"]:
        fail(
            "the DistributedModelParallel does not hold the whole model (the towers' projections are missing)",
            "wrap the model you are given; DMP finds each EBC inside it by the path your plan gives it",
        )
    paths = sorted(_TOWER_TABLES)
    for table, want in report["requested"].items():
        got = report["actual"].get(table)
        if got == want:
            continue
        path = next(p for p, tables in _TOWER_TABLES.items() if table in tables)
        if got is None and path not in report["plan paths"]:
            wrong = [p for p in report["plan paths"] if p not in paths]
            fail(
                f"{on}table {table!r} is not sharded: the plan has no entry for its EBC, at {path!r} "
                f"(the plan's paths: {report['plan paths']})",
                f"the model has EBCs at {paths}: plan each one under its path from model.named_modules()"
                + (f"; {wrong} is not a path of this model" if wrong else ""),
            )
        fail(
            f"{on}table {table!r} is {_describe(got)}, per_table asks for {_describe(want)}",
            "build the plan from per_table and pass it, plan=your_plan: without plan=, DMP runs its own planner "
            "and shards as it likes",
        )
    if report.get("replicas") != "DistributedDataParallel":
        fail(
            f"DMP did not wrap the dense part in DistributedDataParallel (it is a {report.get('replicas')}): "
            "each rank would train its own dense replica",
            "leave init_data_parallel at its default (True); section 5 shows the replicas drift apart without it",
        )
    want_lr = training.DEFAULT_EMBEDDING_LR
    lr_ok = all(math.isclose(lr, want_lr, rel_tol=1e-6) for lr in report.get("fused lr", []))
    if "fused states" in report and (not report["fused states"] or not lr_ok):
        if not report["fused states"]:
            fail(
                f"the fused tables train with exact SGD at lr {_rates(report['fused lr'])}: fbgemm's default, because the "
                "sharders you passed (or DMP's default ones) name no optimizer",
                "pass the course's sharders, sharders=training.sharders(): their EBC sharder fuses Adagrad at "
                f"lr {want_lr} into backward (lab 05)",
            )
        fail(
            f"the fused tables train at lr {_rates(report['fused lr'])}, the course's sharders use {want_lr}",
            "pass sharders=training.sharders() as they are (their default learning rate)",
        )
    if report.get("row-wise states"):
        fail(
            f"the fused tables keep one Adagrad sum per row ({', '.join(report['row-wise states'])}): row-wise Adagrad, "
            "not the course's exact Adagrad (one per weight)",
            "pass sharders=training.sharders() as they are: their EBC sharder fuses EmbOptimType.EXACT_ADAGRAD",
        )
    if "error" in report:
        fail(on + report["error"], "wrap on this rank's device: device=training.device()")


def _rates(rates: list[float]) -> str:
    return ", ".join(f"{rate:.3g}" for rate in rates)


def _describe(sharding: tuple[str, tuple[int, ...]] | None) -> str:
    if sharding is None:
        return "not sharded"
    kind, ranks = sharding
    return f"{kind} on ranks {list(ranks)}"


# ------------------------------------------------------------------------------------------ exercise 2


def _tiny_model() -> torch.nn.Module:
    from course_lib import models

    torch.manual_seed(0)
    return models.click_dlrm(_CHECK_CONFIG.tables(8), _CHECK_CONFIG.num_dense, hidden=16)


def _max_difference(a: torch.nn.Module, b: torch.nn.Module) -> float:
    return max((pa.detach() - pb.detach()).abs().max().item() for pa, pb in zip(a.parameters(), b.parameters()))


@exercise
def check_train_step(train_step: Callable[[Any, Any, Any], Any]) -> None:
    """`train_step(model, optimizer, batch)` must take one gradient step on the batch's loss and return it.

    It is compared, step by step, with a correct step on an unsharded copy of the lab's DLRM (plain SGD).
    """
    from course_lib import training

    log = data.make_click_log(_CHECK_CONFIG)
    batches = [log.train.batch(i * 64, (i + 1) * 64) for i in range(3)]
    reference = _tiny_model()
    model = copy.deepcopy(reference)
    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    steps = [0]
    optimizer.register_step_post_hook(lambda *_: steps.__setitem__(0, steps[0] + 1))
    for i, batch in enumerate(batches):
        before = [p.detach().clone() for p in model.parameters()]
        rates = [group["lr"] for group in optimizer.param_groups]
        stepped = steps[0]
        try:  # the batch is the caller's: the reference step below trains on it too
            got = checked_call("train_step", train_step, model, optimizer, batch, may_change=(0,))  # it trains model
        except CheckFailed:
            raise
        except Exception as error:
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            hint = (
                "the logits and labels the model returns are detached; call backward on the loss, the first "
                "thing model(batch) returns"
                if "does not require grad" in message
                else "model(batch) returns (loss, (loss, logits, labels)); see the cell above"
            )
            fail(f"train_step raised {type(error).__name__}: {message}", hint)
        want = training.train_step(reference, reference_optimizer, batch)
        if isinstance(got, torch.Tensor):
            fail(f"train_step returned a tensor ({got!r}), not a number: a caller that keeps every step's loss keeps "
                 "every step's graph alive (or, detached, a tensor where a float was asked for)",
                 "return the batch's loss as a Python number: loss.item()")
        try:
            got_loss = float(got)
        except (TypeError, ValueError):
            fail(f"train_step returned {got!r}", "return the batch's loss as a number: loss.item()")
        if [group["lr"] for group in optimizer.param_groups] != rates:
            fail(f"step {i + 1}: train_step changed the learning rate of the optimizer it was given "
                 f"({rates} -> {[group['lr'] for group in optimizer.param_groups]})",
                 "the optimizer comes configured: step it as it is")
        if all(torch.equal(b, p.detach()) for b, p in zip(before, model.parameters())):
            fail(
                f"step {i + 1}: the weights did not change",
                "call optimizer.step() after loss.backward() (and zero the gradients before backward, not after)",
            )
        if steps[0] == stepped:
            fail(f"step {i + 1}: the optimizer it was given never stepped: train_step updated the weights some other way "
                 "(an optimizer of its own, or p -= lr * p.grad), which the lab's combined optimizer (fused tables + "
                 "Adam) does not allow",
                 "call optimizer.step() on the optimizer you are handed, after loss.backward()")
        difference = _max_difference(model, reference)
        if difference > 1e-5:
            if i == 0:
                fail(
                    "the first update is not a gradient step on the batch's loss",
                    "call backward on the loss that model(batch) returns, then optimizer.step()",
                )
            fail(
                f"step {i + 1} differs from a correct step (by {difference:.2g}) although step 1 matched",
                "gradients add up across steps until they are zeroed: call optimizer.zero_grad() every step",
            )
        if not math.isclose(got_loss, want, rel_tol=1e-5, abs_tol=1e-6):
            fail(
                f"step {i + 1} returned {got_loss:.6f}, the batch's loss was {want:.6f}",
                "return the loss of this batch, computed by the forward pass before the update",
            )
    passed("train_step matches a correct step for 3 steps: zero the gradients, forward, backward, step")


# ------------------------------------------------------------------------------------------ exercise 3


_SECOND_CONFIG = data.ClickLogConfig(num_train=1_000, num_test=1_500, seed=11)


def _gap_case(
    seed: int, config: data.ClickLogConfig = _CHECK_CONFIG, shares: tuple[float, ...] = (0.35, 0.65)
) -> tuple[list[dict[str, torch.Tensor]], data.ClickSplit, data.ClickLog]:
    """What `launch` returns after scoring a test split: one dict per rank with its share's "logits" and "labels".

    The scores are noisy true logits. The ranks' shares have unequal sizes (`shares`, fractions of the split)
    and different click rates (each holds a band of true logits, as ranks that read files of different
    regions would), shuffled within each rank: the mean of the ranks' AUCs is far from the split's AUC.
    """
    log = data.make_click_log(config)
    split = log.test
    generator = torch.Generator().manual_seed(seed)
    scores = split.true_logits + 1.5 * torch.randn(len(split), generator=generator)
    order = torch.argsort(split.true_logits + torch.randn(len(split), generator=generator))
    sizes = [int(share * len(split)) for share in shares[:-1]]
    sizes.append(len(split) - sum(sizes))
    results = []
    for rows in torch.split(order, sizes):
        rows = rows[torch.randperm(len(rows), generator=generator)]
        results.append({"logits": scores[rows], "labels": split.labels[rows]})
    return results, split, log


def _pooled(results: list[dict[str, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([r["logits"] for r in results]), torch.cat([r["labels"] for r in results])


def _copies(results: list[dict[str, torch.Tensor]]) -> list[dict[str, torch.Tensor]]:
    return [{key: value.clone() for key, value in r.items()} for r in results]


def _call_gap(auc_gap: Callable[[Any, data.ClickSplit], Any], results: list[dict[str, torch.Tensor]],
              split: data.ClickSplit, where: str) -> float:
    given = _copies(results)
    try:
        got = float(auc_gap(given, split))
    except KeyError as error:
        fail(f"auc_gap raised KeyError {error} {where}",
             'each rank\'s dict holds its "logits" and "labels" only: compute the AUC from them')
    except Exception as error:
        text = one_line(error)
        hint = ("the ranks' shares have different sizes: concatenate every rank's logits, and every rank's labels, "
                "in the same rank order (torch.cat)" if any(w in text for w in ("size", "shape", "stack")) else
                "results is a list with one dict per rank; split is the ClickSplit they scored")
        fail(f"auc_gap raised {text} {where}", hint)
    if not all(torch.equal(g[key], r[key]) for g, r in zip(given, results) for key in r):
        fail(
            "auc_gap changed the logits or labels it was given (an in-place operation such as .sigmoid_())",
            "the lab reads the ranks' logits again after the gap (the NE, the calibration): work on a copy, "
            "or use the out-of-place form (.sigmoid()); the AUC needs no sigmoid at all",
        )
    return got


@exercise
def check_auc_gap(auc_gap: Callable[[Any, data.ClickSplit], Any]) -> None:
    """`auc_gap(results, split)`: Bayes-optimal AUC of `split` minus the AUC of all ranks' scores together.

    `results` is what `launch` returns: one dict per rank with its share's "logits" and "labels". Judged on
    2 ranks whose shares differ in size and click rate, on 3 ranks of another log, and on scores that saw the
    labels (a leak), whose gap is negative.
    """
    results, split, log = _gap_case(seed=1)
    logits, labels = _pooled(results)
    model_auc = data.auc(logits, labels)
    optimum = data.bayes_optimal_auc(split)
    want = optimum - model_auc
    got = _call_gap(auc_gap, results, split, "on 2 ranks' results")
    if not math.isclose(got, want, abs_tol=1e-6):
        _diagnose_gap(got, want, results, split, log)
    # 3 ranks of another log: a function that returns the first case's number is not an answer
    results2, split2, _ = _gap_case(seed=2, config=_SECOND_CONFIG, shares=(0.5, 0.2, 0.3))
    want2 = data.bayes_optimal_auc(split2) - data.auc(*_pooled(results2))
    got2 = _call_gap(auc_gap, results2, split2, "on 3 ranks' results")
    if not math.isclose(got2, want2, abs_tol=1e-6):
        per_rank = [data.auc(r["logits"], r["labels"]) for r in results2]
        fail(
            f"on 3 ranks of another log auc_gap returned {got2:.4f}, expected {want2:.4f}",
            "on 2 ranks it was right: does it use every rank of results (not two) and this split's optimum?"
            if not math.isclose(got2, data.bayes_optimal_auc(split2) - sum(per_rank[:2]) / 2, abs_tol=1e-6)
            else "it averaged the first two ranks' AUCs: pool all the ranks' scores",
        )
    # scores that peeked at the labels (a leak) beat the optimum: the gap is negative, and says so
    leaked = [{"logits": split.true_logits[r] + 2.0 * (split.labels[r].float() - 0.5), "labels": split.labels[r]}
              for r in torch.split(torch.arange(len(split)), [900, 1100])]
    want3 = optimum - data.auc(*_pooled(leaked))
    got3 = _call_gap(auc_gap, leaked, split, "on scores that beat the optimum")
    if not math.isclose(got3, want3, abs_tol=1e-6):
        fail(
            f"on scores that saw the test labels (a leak: their AUC beats the optimum's) auc_gap returned "
            f"{got3:.4f}, expected {want3:.4f}"
            + (": the gap was made positive (abs() or max(0, ...))" if got3 >= 0 > want3 else ""),
            "return optimum - model AUC as it comes: a negative gap is the sign that something leaked",
        )
    mean = sum(data.auc(r["logits"], r["labels"]) for r in results) / len(results)
    passed(f"auc_gap = optimum - AUC of all ranks' scores pooled ({want:.4f} on the check's 2 ranks; "
           f"the mean of their own AUCs would say {optimum - mean:.4f})")


def _diagnose_gap(got: float, want: float, results: list[dict[str, torch.Tensor]], split: data.ClickSplit,
                  log: data.ClickLog) -> NoReturn:
    logits, labels = _pooled(results)
    model_auc = data.auc(logits, labels)
    optimum = data.bayes_optimal_auc(split)
    per_rank = [data.auc(r["logits"], r["labels"]) for r in results]
    sizes = [len(r["labels"]) for r in results]
    expected = f"auc_gap returned {got:.4f}, expected {want:.4f}"
    pooled_hint = ("the AUC ranks every click against every non-click of the whole split: concatenate all the ranks' "
                   "logits and all their labels (torch.cat), then compute one AUC")
    if math.isclose(got, -want, abs_tol=1e-6):
        fail(f"{expected}: the sign is flipped",
             "the gap is (best possible AUC) - (model AUC): positive while the model is worse than the optimum")
    if math.isclose(got, optimum - sum(per_rank) / len(per_rank), abs_tol=1e-6):
        fail(f"{expected}: that is the optimum minus the mean of the ranks' own AUCs "
             f"({', '.join(f'{a:.4f}' for a in per_rank)})",
             "an AUC is not an average: each rank's AUC compares only its own clicks with its own non-clicks, and "
             "the ranks' click rates differ. " + pooled_hint)
    if math.isclose(got, optimum - sum(a * n for a, n in zip(per_rank, sizes)) / sum(sizes), abs_tol=1e-6):
        fail(f"{expected}: that is the optimum minus the ranks' AUCs averaged by their sizes",
             "weights do not fix it: each rank's AUC never compares its clicks with the other ranks' non-clicks. "
             + pooled_hint)
    if math.isclose(got, optimum - per_rank[0], abs_tol=1e-6):
        fail(f"{expected}: that is rank 0's share only", "rank 0 scored its own share of the split: " + pooled_hint)
    for order in itertools.permutations(range(len(results))):
        if list(order) != sorted(order):
            others = torch.cat([results[r]["labels"] for r in order])
            if math.isclose(got, optimum - data.auc(logits, others), abs_tol=1e-6):
                fail(f"{expected}: each rank's logits were scored against other ranks' labels",
                     "concatenate the logits and the labels in the same rank order: row i of the logits must "
                     "meet row i of the labels")
    if math.isclose(got, data.bayes_optimal_auc(log.train) - model_auc, abs_tol=1e-6):
        fail(f"{expected}: that is the train split's optimum",
             "compare with the optimum of the split the model was evaluated on (its impressions and their labels "
             "are different draws)")
    if math.isclose(got, optimum - data.auc(logits, split.labels), abs_tol=1e-6):
        fail(f"{expected}: the logits were scored against split.labels",
             "the logits come back in the ranks' order, not the split's: score them against the labels returned "
             "with them")
    if math.isclose(got, 0.0, abs_tol=1e-6):
        fail(f"auc_gap returned 0, expected {want:.4f}: the optimum was compared with itself",
             "the model's AUC comes from the ranks' logits (the model's scores), not from split.true_logits")
    if math.isclose(got, 1 - model_auc, abs_tol=1e-6) or math.isclose(got, model_auc, abs_tol=1e-6):
        fail(f"{expected}: the optimum is missing",
             "the best possible AUC is not 1 on a noisy log: it is data.bayes_optimal_auc(split)")
    if f"{got:.4f}" == f"{want:.4f}":
        fail(f"auc_gap returned {got:.6f}, expected {want:.6f}: close, not exact",
             "compute the exact AUC: BinaryAUROC() without thresholds= (binned), or data.auc(logits, labels)")
    fail(expected, "data.bayes_optimal_auc(split) - the AUC of all ranks' logits against their labels, pooled")


# ------------------------------------------------------------------------------------------ exercise 4

_PIPELINE_STEPS = 6


def _raw_log_model(dlrm: Any) -> Any:
    """The lab's FoldIdsInForward: folds every id modulo 20 and caps the dense features at 2, in forward."""
    from torchrec import KeyedJaggedTensor
    from torchrec.models.dlrm import DLRMTrain

    class FoldIdsInForward(DLRMTrain):
        def forward(self, batch: Any) -> Any:
            raw = batch.sparse_features
            ids = KeyedJaggedTensor(keys=raw.keys(), values=raw.values() % 20, lengths=raw.lengths())
            dense = batch.dense_features.clamp(max=2.0)
            logits = self.model(dense, ids).squeeze(-1)
            loss = self.loss_fn(logits, batch.labels.float())
            return loss, (loss.detach(), logits.detach(), batch.labels)

    return FoldIdsInForward(dlrm)


def _pipeline_on_rank(model_class: Callable[[Any], Any], prepare: Callable[[Any], Any]) -> dict[str, Any]:
    """Runs on every rank: the reference trained by a plain loop, then the learner's pair in the pipeline."""
    import torch.distributed as dist
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.train_pipeline import TrainPipelineSparseDist

    from course_lib import models, planning

    rank, world_size = dist.get_rank(), dist.get_world_size()
    split = data.make_click_log(_CHECK_CONFIG).train

    def sharded(wrapper: Callable[[Any], Any]) -> Any:
        torch.manual_seed(0)
        model = wrapper(models.click_dlrm(_CHECK_CONFIG.tables(16), _CHECK_CONFIG.num_dense, device="meta").model)
        planner = EmbeddingShardingPlanner(topology=planning.topology(world_size))
        plan = planner.collective_plan(model, training.sharders(), dist.GroupMember.WORLD)
        return DistributedModelParallel(model, device=training.device(), plan=plan, sharders=training.sharders())

    reference = sharded(_raw_log_model)
    want = training.train(reference, training.optimizer(reference), split, 64, max_steps=_PIPELINE_STEPS, desc=None)
    report: dict[str, Any] = {"want": want}
    try:
        dmp = sharded(model_class)
    except Exception as error:
        raise_if_unwritten(error)
        report["error"] = f"building and sharding PipelinedModel(dlrm) raised {one_line(error)}"
        return report
    pipeline = TrainPipelineSparseDist(dmp, training.optimizer(dmp), training.device())
    batches = (prepare(batch) for batch in data.batches(split, 64, rank, world_size))
    try:
        with training.pipelining_log() as verdicts:
            report["got"] = [float(pipeline.progress(batches)[0]) for _ in range(_PIPELINE_STEPS)]
    except Exception as error:
        raise_if_unwritten(error)
        report["error"] = f"the pipeline raised {one_line(error)}"
    report["verdicts"] = list(verdicts)
    return report


@exercise
def check_pipelineable(
    model_class: Callable[[Any], Any], prepare: Callable[[Any], Any], launch: Callable[..., list[Any]] | None = None
) -> None:
    """`model_class(dlrm)` and `prepare(batch)` must train exactly as ``FoldIdsInForward`` does, with the
    sharded EBC taken over by ``TrainPipelineSparseDist`` (its input dist overlapped).

    The check runs both on 2 ranks on a log of its own: the reference (``FoldIdsInForward``) in a plain loop,
    then `model_class` in the pipeline fed ``prepare(batch)`` for every batch, and compares the losses.
    """
    if launch is None:
        from course_lib import launch
    report = launch(_pipeline_on_rank, model_class, prepare, world_size=2, show_ranks=[])[0]
    verdicts = report.get("verdicts", [])
    refused = [v for v in verdicts if "will NOT be pipelined" in v]
    if refused:
        fail(
            "torchrec will NOT pipeline the EBC: it gets a KeyedJaggedTensor that forward computes",
            "move the id folding into prepare(batch) (the data pipeline); forward must hand the batch's own "
            "sparse_features to the model",
        )
    if "error" in report:
        fail(report["error"], "prepare(batch) returns a torchrec Batch; PipelinedModel(dlrm) is a DLRMTrain subclass")
    if not verdicts:
        fail(
            "the pipeline found no sharded module to take over",
            "PipelinedModel must hold the DLRM it is given (DLRMTrain.__init__ stores it as self.model)",
        )
    got, want = report["got"], report["want"]
    for step, (g, w) in enumerate(zip(got, want)):
        if not math.isclose(g, w, rel_tol=1e-5, abs_tol=1e-6):
            hint = (
                "the first loss differs already: the model no longer computes what FoldIdsInForward computes "
                "(are the ids folded exactly once, and the dense features still capped at 2?)"
                if step == 0
                else "the losses part after the first step: does the model still update the way the reference does?"
            )
            fail(f"step {step + 1}: loss {g:.6f}, FoldIdsInForward's loss {w:.6f}", hint)
    passed(
        f"the EBC is pipelined and {len(got)} losses equal FoldIdsInForward's: the EBC gets the batch's own ids, "
        "folded before forward (all the pipeline needs; dense work may stay in forward or move too)"
    )
