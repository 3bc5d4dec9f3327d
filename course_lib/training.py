"""Train and evaluate a DistributedModelParallel recommender, one rank's view: the loop a lab runs on every rank.

    model = DistributedModelParallel(click_dlrm(log.tables(16), 4, device="meta"), device=cpu,
                                     sharders=training.sharders())
    optimizer = training.optimizer(model)                  # fused embedding optimizer + Adam for the dense part
    losses = training.train(model, optimizer, log.train, batch_size=1024, epochs=3)   # progress bar from rank 0
    logits, labels = training.predict(model, log.test)     # this rank's share of the test split
    training.auc(logits, labels)                           # the AUC of all ranks' scores, on every rank

Models follow torchrec's ``DLRMTrain`` convention: ``model(batch)`` returns ``(loss, (loss, logits, labels))``
with a ``torchrec.datasets.utils.Batch`` in (``course_lib.data.batches`` makes them). Every function here
that runs a forward pass of a sharded model must run on every rank at the same time (each forward is a
collective); that is also true under torchrun. Nothing here needs a GPU; under NCCL, batches move to
``cuda:LOCAL_RANK``.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import nn

from course_lib import data, planning  # noqa: F401  (importing planning drops torchrec's notices
# "Sharding spec not found for ..." about data-parallel tables)
from course_lib.launcher import progress
from course_lib.launcher._rank import rank_device

__all__ = [
    "Step",
    "auc",
    "device",
    "model_plan",
    "optimizer",
    "pipelining_log",
    "predict",
    "replica_spread",
    "require_pipelined",
    "semi_sync_attempt",
    "sharders",
    "sharding_types",
    "step_collectives",
    "state_dict_shards",
    "train",
    "train_step",
]

Step = Callable[[nn.Module, Any, Any], float]
DEFAULT_EMBEDDING_LR = 0.1
DEFAULT_DENSE_LR = 0.005


def device() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` under NCCL, else the CPU (``course_lib.launcher._rank.rank_device``)."""
    return rank_device()


def sharders(learning_rate: float = DEFAULT_EMBEDDING_LR) -> list[Any]:
    """The EmbeddingBagCollection sharder with a fused Adagrad (the tables update inside backward; lab 05).

    Adagrad is one of the few optimizers fbgemm's CPU kernels fuse (with exact SGD and row-wise Adagrad);
    on GPUs Adam and others join them.
    """
    from fbgemm_gpu.split_embedding_configs import EmbOptimType
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [
        EmbeddingBagCollectionSharder(
            fused_params={"optimizer": EmbOptimType.EXACT_ADAGRAD, "learning_rate": learning_rate}
        )
    ]


def optimizer(model: nn.Module, dense_learning_rate: float = DEFAULT_DENSE_LR) -> Any:
    """One optimizer for a DMP model: its fused embedding optimizer plus Adam over every other parameter.

    ``model.fused_optimizer`` belongs to the tables with a fused kernel, which update inside backward: its
    ``step()`` and ``zero_grad()`` have nothing left to do, but it carries their optimizer state and
    learning rate. Adam gets the rest: the dense part, data-parallel tables and tables sharded with the
    dense kernel. (On a plain, unsharded module it is just Adam over all parameters; on a model of fused
    tables only, the fused optimizer alone.)
    """
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

    fused = {name for name, sharding in _table_shardings(model).items() if sharding.compute_kernel.startswith("fused")}
    rest = {name: p for name, p in model.named_parameters() if name not in fused}
    fused_optimizer = getattr(model, "fused_optimizer", None)
    if not rest and fused_optimizer is not None:  # every parameter is a fused table: a torch optimizer over
        return CombinedOptimizer([fused_optimizer])  # nothing would raise "optimizer got an empty parameter list"
    dense = KeyedOptimizerWrapper(rest, lambda params: torch.optim.Adam(params, lr=dense_learning_rate))
    return CombinedOptimizer([fused_optimizer, dense]) if fused_optimizer is not None else dense


def _table_shardings(model: nn.Module) -> dict[str, Any]:
    """``{parameter name: ParameterSharding}`` for every table of every sharded EBC in `model`, named as
    ``model.named_parameters()`` names them."""
    inner = getattr(model, "module", model)  # DMP.module: the model without its DMP/DDP wrappers
    found = {}
    for path, module in inner.named_modules():
        plan = getattr(module, "module_sharding_plan", None)
        if isinstance(plan, Mapping):
            prefix = f"{path}." if path else ""
            for table, sharding in plan.items():
                found[f"{prefix}embedding_bags.{table}.weight"] = sharding
    return found


def train_step(model: nn.Module, optimizer: Any, batch: Any) -> float:
    """One training step on one batch; returns the batch's loss (before the update)."""
    optimizer.zero_grad()
    loss, _ = model(batch)
    loss.backward()
    optimizer.step()
    return loss.item()


def train(
    model: nn.Module,
    optimizer: Any,
    split: data.ClickSplit,
    batch_size: int,
    epochs: int = 1,
    *,
    step: Step = train_step,
    desc: str | None = "train",
    max_steps: int | None = None,
) -> list[float]:
    """Train on this rank's share of `split` for `epochs` (or `max_steps` steps); returns this rank's losses.

    Rank 0 reports every step to ``course_lib.launcher.progress`` (one live bar in the launching cell; `desc=None`
    reports nothing). `step` is the training step, ``train_step`` by default.
    """
    rank, world_size = _rank_and_size()
    steps_per_epoch = len(split) // (batch_size * world_size)
    total = steps_per_epoch * epochs if max_steps is None else min(max_steps, steps_per_epoch * epochs)
    model.train()
    losses: list[float] = []
    where = device()
    for _ in range(epochs):
        for batch in data.batches(split, batch_size, rank, world_size):
            if len(losses) == total:
                return losses
            loss = step(model, optimizer, batch.to(where))
            losses.append(float(loss))
            if desc is not None:
                progress.report(len(losses), total, desc=desc, loss=losses[-1])
    return losses


@torch.no_grad()
def predict(model: nn.Module, split: data.ClickSplit, batch_size: int = 2048) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of `split` scored: ``(logits, labels)``, every row of the split on exactly one rank."""
    rank, world_size = _rank_and_size()
    was_training = model.training
    model.eval()
    logits, labels = [], []
    try:
        for batch in data.batches(split, batch_size, rank, world_size, drop_last=False):
            _, (_, batch_logits, batch_labels) = model(batch.to(device()))
            logits.append(batch_logits.float().cpu())
            labels.append(batch_labels.cpu())
    finally:
        model.train(was_training)
    return torch.cat(logits), torch.cat(labels)


def auc(logits: torch.Tensor, labels: torch.Tensor) -> float:
    """AUC of all ranks' scores together, the same on every rank: torchmetrics' ``BinaryAUROC`` gathers the
    ranks' (logits, labels) in ``compute()`` when a process group is initialised."""
    from torchmetrics.classification import BinaryAUROC

    metric = BinaryAUROC()
    metric.update(logits, labels)
    return float(metric.compute())


def _rank_and_size() -> tuple[int, int]:
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


# ------------------------------------------------------------------------------- plans and what DMP holds


def model_plan(model: nn.Module, per_table: Mapping[str, Any], world_size: int, device_type: str = "cpu") -> Any:
    """A hand-written ShardingPlan for the EmbeddingBagCollection inside `model` (found wherever it sits).

    `per_table` maps every table name to a generator from ``torchrec.distributed.sharding_plan``
    (``table_wise(rank=1)``, ``column_wise(ranks=[0, 1])``, ``row_wise()``, ``data_parallel()``); the
    plan is ``planning.module_plan`` with the course's sharder, under the EBC's path in `model`.
    """
    from torchrec import EmbeddingBagCollection
    from torchrec.distributed.types import ShardingPlan

    paths = [name for name, module in model.named_modules() if isinstance(module, EmbeddingBagCollection)]
    if len(paths) != 1:
        raise ValueError(f"model_plan expects one EmbeddingBagCollection in the model, found {paths}")
    plan = planning.module_plan(
        model.get_submodule(paths[0]), per_table, world_size=world_size, device_type=device_type, sharder=sharders()[0]
    )
    return ShardingPlan({paths[0]: plan})


def sharding_types(model: nn.Module) -> dict[str, tuple[str, tuple[int, ...]]]:
    """What a DMP model actually did: ``{table: (sharding type, ranks)}`` read from its sharded modules."""
    found: dict[str, tuple[str, tuple[int, ...]]] = {}
    for module in model.modules():
        plan = getattr(module, "module_sharding_plan", None)
        if not isinstance(plan, Mapping):
            continue
        for table, sharding in plan.items():
            found[table] = (sharding.sharding_type, tuple(sharding.ranks or ()))
    return found


def state_dict_shards(model: nn.Module) -> list[dict[str, Any]]:
    """One row per ``state_dict`` entry of this rank: its type, global shape, and what this rank stores.

    "stored here" lists the local shards of a ShardedTensor as slices of the whole tensor
    (``"[250:500, 0:16]"``: rows 250-499, all 16 columns), "none" when this rank holds no shard of it, and
    "all" for a plain tensor (a replica).
    """
    rows = []
    for key, value in model.state_dict().items():
        if hasattr(value, "local_shards") and hasattr(value, "metadata"):  # ShardedTensor
            shape = tuple(value.metadata().size)
            here = " ".join(
                "[" + ", ".join(f"{o}:{o + n}" for o, n in zip(s.metadata.shard_offsets, s.metadata.shard_sizes)) + "]"
                for s in value.local_shards()
            ) or "none"
        else:
            shape, here = tuple(value.shape), "all"
        rows.append({"key": key, "type": type(value).__name__, "global shape": shape, "stored here": here})
    return rows


def replica_spread(model: nn.Module) -> dict[str, float]:
    """For each replicated parameter (the dense part and data-parallel tables: everything the plan does not
    cut into shards), the largest difference between the ranks' copies: 0.0 where every rank holds the
    same replica."""
    sharded = {name for name, sharding in _table_shardings(model).items() if sharding.sharding_type != "data_parallel"}
    spread = {}
    for name, parameter in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if name in sharded:
            continue
        tensor = parameter.detach().float().contiguous()
        gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, tensor)
        spread[name] = max((g - gathered[0]).abs().max().item() for g in gathered)
    return spread


# --------------------------------------------------------------------------------------- train pipeline

_PIPELINE_LOGGER = "torchrec.distributed.train_pipeline.utils"


class _Collect(logging.Handler):
    def __init__(self, sink: list[str]) -> None:
        super().__init__(logging.INFO)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "pipelined" in message and message.startswith("Module "):
            self.sink.append(message)


@contextmanager
def pipelining_log() -> Iterator[list[str]]:
    """Collect torchrec's verdict on each sharded module while a TrainPipelineSparseDist starts, e.g.
    "Module 'model.sparse_arch.embedding_bag_collection' will be pipelined".

    torchrec logs these lines (at INFO, and a WARNING for the modules it cannot pipeline) when the first
    ``progress()`` call rewrites the model; ``course_lib.launcher.quiet`` otherwise silences torchrec's loggers.
    """
    messages: list[str] = []
    logger = logging.getLogger(_PIPELINE_LOGGER)
    handler = _Collect(messages)
    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


def require_pipelined(messages: Sequence[str]) -> list[str]:
    """The modules the pipeline took over; raises if any sharded module will NOT be pipelined."""
    refused = [m for m in messages if "will NOT be pipelined" in m]
    if refused or not messages:
        why = "; ".join(refused) or "no sharded module was found in the traced model"
        raise RuntimeError(
            f"TrainPipelineSparseDist cannot overlap this model's input distribution: {why}. "
            "The sharded module must receive the batch's KeyedJaggedTensor as it comes (only attribute "
            "access on the batch, traceable by torch.fx); move id transformations into the data pipeline."
        )
    return [m.split("'")[1] for m in messages]


def step_collectives(model: nn.Module, step: Callable[[], Any]) -> list[dict[str, Any]]:
    """The collectives that one call of `step()` issues on this rank, in order, each labelled by when it was
    issued: "before forward", "forward" or "after forward" (backward and the optimizer) of the DLRM inside
    `model` (``model.module.model`` for a DMP of a DLRMTrain). Shows what a train pipeline moved where."""
    from course_lib import trace

    dlrm = getattr(model, "module", model).model
    with trace.collectives() as log:
        log._phase = "before forward"
        handles = [
            dlrm.register_forward_pre_hook(lambda *_: setattr(log, "_phase", "forward")),
            dlrm.register_forward_hook(lambda *_: setattr(log, "_phase", "after forward")),
        ]
        try:
            step()
        finally:
            for handle in handles:
                handle.remove()
    return [
        {"issued": r.phase, "collective": r.op, "dtype": r.dtype, "elements": sum(math.prod(s) for s in r.in_shapes)}
        for r in log.records
    ]


def semi_sync_attempt(steps: int = 3, batch_size: int = 256) -> str:
    """Run on every rank: drive the lab's DLRM with torchrec's ``TrainPipelineSemiSync`` for a few steps.

    Returns ``"ran"`` or the first line of the error (on CPU: ``RuntimeError: unknown parameter type``, from
    ``record_stream`` on a stream that CPUs do not have). Lab 12 shows it.
    """
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.train_pipeline.train_pipelines import TrainPipelineSemiSync

    from course_lib import models

    config = data.ClickLogConfig(num_train=4_000, num_test=200)
    log = data.make_click_log(config)
    model = models.click_dlrm(config.tables(16), config.num_dense, device="meta")
    plan = EmbeddingShardingPlanner(topology=planning.topology(dist.get_world_size())).collective_plan(
        model, sharders(), dist.GroupMember.WORLD
    )
    dmp = DistributedModelParallel(model, device=device(), plan=plan, sharders=sharders())
    pipeline = TrainPipelineSemiSync(dmp, optimizer(dmp), device(), start_batch=0)
    batches = data.batches(log.train, batch_size, dist.get_rank(), dist.get_world_size())
    try:
        for _ in range(steps):
            pipeline.progress(batches)
    except Exception as error:
        return f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
    return "ran"
