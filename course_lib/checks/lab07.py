"""Checks for 07_hybrid: a DMP data-parallel wrapper that shards the dense part with FSDP2, and the bytes
each rank then holds for the dense part.

`check_wrapper` builds the lab's DLRM (with a dense tower of another width than the lab's, which normalises
its inputs with a ``BatchNorm1d``: a layer with buffers) on 2 ranks, shards its tables with DMP, gives each
rank *different* dense weights and *different* BatchNorm buffers, and hands the rest to the learner's
wrapper; then it looks at what came out (are the tables still TorchRec shards, are the dense parameters
DTensors placed ``Shard(0)``, did anything wrap the model in DDP, does every rank now hold rank 0's initial
dense weights and rank 0's buffers) and trains it a few steps.
`check_dense_bytes` compares the learner's formula with bytes measured on 2 and 3 ranks for a dense tower
whose sizes the lab did not use.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from course_lib import data
from course_lib.checks import CheckFailed, checked_call, exercise, fail, is_number, launch_quietly, one_line, passed

_TIMEOUT_S = 90.0
# A small world for the checks: the lab's tables, few rows (fast to make and to train on).
_CHECK_CONFIG = data.ClickLogConfig(num_train=6_144, num_test=1_024, seed=5)
_BATCH = 256
_STEPS = 12
# The wrapper check's dense tower: not the lab's width (32), so nothing the lab printed fits it by chance.
WRAPPER_HIDDEN = 24
# The dense tower of the bytes exercise: another hidden width than the lab's (24 rows do not split evenly
# over 3 ranks in every layer, and the head's one row never does).
BYTES_HIDDEN = 24


# ------------------------------------------------------------------------------------------ exercise 1


def _check_plan(model: Any, world_size: int) -> Any:
    """Every table sharded (none data-parallel): t_user column-wise over both ranks, the others table-wise."""
    from torchrec.distributed.sharding_plan import column_wise, table_wise

    from course_lib import training

    fused = "fused"
    per_table = {
        "t_user": column_wise(ranks=[0, 1], compute_kernel=fused),
        "t_item": table_wise(rank=1, compute_kernel=fused),
        "t_category": table_wise(rank=0, compute_kernel=fused),
        "t_terms": table_wise(rank=0, compute_kernel=fused),
    }
    return training.model_plan(model, per_table, world_size)


def _check_model() -> Any:
    """The lab's DLRM on meta, with MLPs `WRAPPER_HIDDEN` wide and a ``BatchNorm1d`` over the dense features in
    front of the dense MLP: a dense layer with buffers (running_mean, running_var, num_batches_tracked)."""
    import torch

    from course_lib import models

    model = models.click_dlrm(_CHECK_CONFIG.tables(16), _CHECK_CONFIG.num_dense, hidden=WRAPPER_HIDDEN, device="meta")
    dense_arch = model.model.dense_arch
    dense_arch.model = torch.nn.Sequential(torch.nn.BatchNorm1d(_CHECK_CONFIG.num_dense, device="meta"), dense_arch.model)
    return model


def _dense_buffers(model: Any) -> dict[str, Any]:
    """The buffers of `model`'s BatchNorm layers, by name (the interaction's triu_indices, equal on every rank
    and outside the dense modules, is not one)."""
    import torch

    return {f"{path}.{name}": buffer for path, module in model.named_modules()
            if isinstance(module, torch.nn.modules.batchnorm._BatchNorm)
            for name, buffer in module.named_buffers(recurse=False)}


class _Recorded:
    """Around the learner's wrapper: make the ranks' dense weights and BatchNorm buffers surely differ (each rank
    adds its own noise, and counts its own batches), remember them, then call the learner's ``wrap``."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.before: dict[str, Any] = {}
        self.before_buffers: dict[str, Any] = {}

    def wrap(self, dmp: Any, env: Any, device: Any) -> None:
        import torch
        import torch.distributed as dist

        rank = dist.get_rank()
        generator = torch.Generator().manual_seed(1_000 + rank)
        model = dmp._dmp_wrapped_module
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "embedding_bags" not in name:
                    p.add_(0.05 * torch.randn(p.shape, generator=generator).to(p.device))
                    self.before[name] = p.detach().cpu().clone()
            for name, buffer in _dense_buffers(model).items():
                if buffer.is_floating_point():  # running_mean moves, running_var stays positive
                    noise = torch.rand(buffer.shape, generator=generator).to(buffer.device)
                    buffer.add_(0.5 * noise) if name.endswith("running_mean") else buffer.mul_(1 + noise)
                else:  # num_batches_tracked: as if each rank had counted its own batches
                    buffer.add_(10 + 7 * rank)
                self.before_buffers[name] = buffer.detach().cpu().clone()
        self.inner.wrap(dmp, env, device)


def _inspect_wrapper(wrapper: Any, train_split: data.ClickSplit) -> dict[str, Any]:
    """On each rank: DMP with the learner's wrapper, what it holds, a trace of one step, a few steps' losses."""
    import torch
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor
    from torch.nn.parallel import DistributedDataParallel
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.model_parallel import DataParallelWrapper

    from course_lib import hybrid, trace, training

    torch.manual_seed(0)
    model = _check_model()
    instance = wrapper() if isinstance(wrapper, type) else wrapper
    recorded = _Recorded(instance)
    recorder = type("Recorded", (DataParallelWrapper,), {"wrap": lambda self, *a: recorded.wrap(*a)})()
    try:
        dmp = DistributedModelParallel(
            model, device=training.device(), plan=_check_plan(model, dist.get_world_size()),
            sharders=training.sharders(), data_parallel_wrapper=recorder,
        )
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001  (a learner's bug: reported, not a crash)
        return {"wrap_error": one_line(error)}
    state = dmp.state_dict()
    report: dict[str, Any] = {
        "tables": {k.rsplit(".", 2)[-2]: type(p).__name__ for k, p in dmp.named_parameters() if "embedding_bags" in k},
        "table_state": sorted({type(v).__name__ for k, v in state.items() if "embedding_bags" in k}),
        "dense": {k: (type(v).__name__, str(getattr(v, "placements", "")))
                  for k, v in state.items() if "embedding_bags" not in k and k not in recorded.before_buffers},
        "ddp": any(isinstance(m, DistributedDataParallel) for m in dmp.modules()),
        "before": recorded.before,
        "before_buffers": recorded.before_buffers,
    }
    if any(t == "DTensor" for t in report["tables"].values()):
        return report  # the optimizer would fail on duplicate keys: the structure says enough
    # the dense weights the model starts from, whole (what every rank computes with)
    report["start"] = {n.removeprefix("_dmp_wrapped_module.").removeprefix("module."):
                       (p.full_tensor() if isinstance(p, DTensor) else p).detach().cpu().clone()
                       for n, p in dmp.named_parameters() if "embedding_bags" not in n}
    buffers = {n.removeprefix("_dmp_wrapped_module.").removeprefix("module."): b for n, b in dmp.named_buffers()}
    report["start_buffers"] = {n: buffers[n].detach().cpu().clone() for n in recorded.before_buffers if n in buffers}
    try:
        optimizer = hybrid.hybrid_optimizer(dmp)
        batches = data.batches(train_split, _BATCH, dist.get_rank(), dist.get_world_size())
        with trace.collectives() as log:
            first = training.train_step(dmp, optimizer, next(batches).to(training.device()))
        losses = [first] + training.train(dmp, optimizer, train_split, _BATCH, epochs=2, max_steps=_STEPS, desc=None)[1:]
    except Exception as error:  # noqa: BLE001
        report["train_error"] = one_line(error)
        return report
    report["ops"] = sorted({r.op for r in log.records})
    report["losses"] = losses
    return report


def _judge_start(reports: list[dict[str, Any]]) -> None:
    """Every rank must start from rank 0's dense weights (what DDP's broadcast gives) and hold rank 0's BatchNorm
    buffers (one model on every rank); say what they are instead."""
    _judge_parameters(reports)
    _judge_buffers(reports)


def _judge_parameters(reports: list[dict[str, Any]]) -> None:
    import torch

    before0, before1 = reports[0]["before"], reports[1]["before"]
    starts = [r["start"] for r in reports]
    names = sorted(before0)
    if any(set(s) != set(names) for s in starts):
        fail(f"the dense parameters after wrap() are not the model's ({sorted(starts[0])[:3]} ...)",
             "shard the modules in place: fully_shard(module) replaces their parameters, it returns nothing to keep")
    if any(not torch.equal(starts[0][n], s[n]) for s in starts[1:] for n in names):
        fail("the ranks hold different dense weights after wrap()",
             "give every rank the same weights before fully_shard (dist.broadcast from rank 0)")
    start = starts[0]
    if all(torch.equal(start[n], before0[n]) for n in names):
        return
    differ = [n for n in names if not torch.equal(start[n], before0[n])]
    shown = ", ".join(sorted({".".join(n.split(".")[:2]) for n in differ}))

    def chunks(n: str) -> Any:
        rows0, rows1 = before0[n].chunk(2), before1[n].chunk(2)
        return torch.cat([rows0[0], *rows1[1:]]) if before0[n].shape[0] > 1 else before0[n]

    if all(torch.equal(start[n], chunks(n)) for n in differ):
        kinds = sorted({n.rsplit(".", 1)[-1] for n in differ})
        if kinds != sorted({n.rsplit(".", 1)[-1] for n in names}):  # e.g. the weights broadcast, the biases not
            fail(
                f"the model starts from a patchwork of rank 0's and rank 1's rows in every {' and '.join(kinds)} "
                "(the others are rank 0's): fully_shard kept each rank's own rows of what was not broadcast (or "
                "not yet: a broadcast with async_op=True that nobody waited for)",
                f"broadcast every parameter of the dense modules, the {' and '.join(kinds)} too "
                "(module.parameters(), not only some of them); with async_op=True, wait() on each Work before "
                "fully_shard",
            )
        fail(
            f"the model starts from a patchwork ({shown}): rank 0's rows of each dense parameter and rank 1's "
            "rows, because fully_shard keeps each rank's own rows and the ranks' initial weights differ "
            "(DMP's table initialisation moved each rank's RNG differently)",
            "before fully_shard, broadcast rank 0's dense parameters and buffers to every rank, as DDP broadcasts "
            "the parameters when it wraps a model: with torch.no_grad(), dist.broadcast(t.data, src=0) for every "
            "parameter and buffer of "
            + ("the dense modules" if {n.split(".")[1] for n in differ} == {n.split(".")[1] for n in names}
               else f"every dense module ({shown} too)")
            + " (with async_op=True, wait() on each Work before fully_shard)",
        )
    if all(torch.equal(start[n], before1[n]) for n in differ):
        fail(
            "every rank starts from rank 1's dense weights",
            "broadcast from rank 0 (src=0): DDP makes every rank start from rank 0's weights, and the run must "
            "match a DDP run",
        )
    if all(torch.allclose(start[n], (before0[n] + before1[n]) / 2, atol=1e-6) for n in differ):
        fail(
            "every rank starts from the mean of the ranks' initial weights: a model nobody initialised (averaging "
            "two random initialisations shrinks their spread)",
            "broadcast rank 0's weights (dist.broadcast(p.data, src=0)) instead of averaging with all_reduce",
        )
    fail(
        f"the dense weights after wrap() ({shown}) are equal on every rank but are not rank 0's initial weights",
        "keep the weights the model was initialised with: broadcast rank 0's parameters BEFORE fully_shard (after "
        "it each rank holds only its rows), rather than re-initialising or re-seeding",
    )


def _listed(names: list[str]) -> str:
    """'running_mean, running_var of dense_arch.model.0' for buffer names, grouped by their module."""
    by_module: dict[str, list[str]] = {}
    for name in names:
        path, leaf = name.removeprefix("model.").rsplit(".", 1)
        by_module.setdefault(path, []).append(leaf)
    return "; ".join(f"{', '.join(leaves)} of {path}" for path, leaves in by_module.items())


def _judge_buffers(reports: list[dict[str, Any]]) -> None:
    """Every rank must hold rank 0's BatchNorm buffers after wrap(): name the buffers that are not."""
    import torch

    before0, before1 = reports[0].get("before_buffers", {}), reports[1].get("before_buffers", {})
    starts = [r.get("start_buffers", {}) for r in reports]
    names = sorted(before0)
    gone = [n for n in names if any(n not in s for s in starts)]
    if gone:
        fail(f"the model has no BatchNorm buffers {_listed(gone)} after wrap()",
             "shard the modules in place and keep their layers: fully_shard(module) returns nothing to keep")
    wrong = [[n for n in names if not torch.equal(s[n], before0[n])] for s in starts]
    if not any(wrong):
        return
    if not wrong[0] and all(torch.equal(starts[1][n], before1[n]) for n in wrong[1]):
        if len(wrong[1]) == len(names):
            fail(
                f"rank 1 still holds its own BatchNorm buffers after wrap(), not rank 0's ({_listed(names)}): "
                "the broadcast sent the parameters only, and a BatchNorm's running statistics are buffers, not "
                "parameters",
                "send the dense modules' buffers too (module.buffers(), next to module.parameters()): every rank "
                "must hold the same model, or the ranks normalise the same batch differently in eval mode",
            )
        fail(
            f"rank 1 still holds its own {_listed(wrong[1])} after wrap() (its other BatchNorm buffers are rank "
            "0's)",
            "broadcast every buffer of the dense modules, whatever its dtype: num_batches_tracked is an int64 "
            "buffer, and dist.broadcast sends it as it is",
        )
    if all(torch.equal(s[n], before1[n]) for s in starts for n in names):
        fail("every rank holds rank 1's BatchNorm buffers after wrap()",
             "broadcast the buffers from rank 0 (src=0), like the parameters")
    if all(torch.equal(s[n], starts[0][n]) for s in starts[1:] for n in names):
        fail(
            f"the BatchNorm buffers after wrap() are equal on every rank but are not rank 0's ({_listed(wrong[0])})",
            "keep rank 0's: broadcast them from rank 0, rather than resetting the running statistics or "
            "computing them again",
        )
    fail(
        f"the ranks hold different BatchNorm buffers after wrap(): on rank 1, {_listed(wrong[1] or wrong[0])} "
        "differ from rank 0's",
        "broadcast every buffer of the dense modules from rank 0 (src=0), with the parameters",
    )


@exercise
def check_wrapper(wrapper: Any, launch: Callable[..., list[Any]] | None = None) -> None:
    """Run DMP with `wrapper` (a DataParallelWrapper subclass, or an instance) as its data_parallel_wrapper on 2
    ranks: the tables must stay TorchRec shards, every dense parameter must be a ``Shard(0)`` DTensor, every rank
    must start from rank 0's dense weights and hold rank 0's BatchNorm buffers (the check's dense tower has a
    BatchNorm1d, and the check gives the ranks different weights and buffers first), the loss must fall."""
    from course_lib.launcher.launch import LaunchError

    if launch is None:
        from course_lib import launch
    from torchrec.distributed.model_parallel import DataParallelWrapper

    if not (isinstance(wrapper, DataParallelWrapper) or (isinstance(wrapper, type) and issubclass(wrapper, DataParallelWrapper))):
        fail(f"expected a DataParallelWrapper subclass, got {wrapper!r}",
             "write `class ...(DataParallelWrapper):` with a `wrap(self, dmp, env, device)` method")
    split = data.make_click_log(_CHECK_CONFIG).train
    try:
        reports = launch_quietly(launch, _inspect_wrapper, wrapper, split, world_size=2, timeout=_TIMEOUT_S)
    except LaunchError as error:
        raised = [f for f in error.failures if f.kind == "raised"]
        if raised and all(f.exc_type == "NotImplementedError" for f in raised):
            fail("the wrapper is not written yet", "replace `raise NotImplementedError()` with your code")
        first = error.failures[0].headline() if error.failures else error.summary
        if any(f.kind in ("exited", "timed out") for f in error.failures):
            fail(f"DMP with your wrapper failed on 2 ranks: {first}",
                 "a collective in wrap() got tensors of different shapes on the two ranks (gloo aborts) or was "
                 "called on one rank only: broadcast only the dense modules' parameters and buffers (each rank holds "
                 "other table shards), on every rank, and before fully_shard (after it each rank holds other rows)")
        fail(f"DMP with your wrapper failed on 2 ranks: {first}", "run it yourself in a launched function to read the traceback")
    report = reports[0]
    if "wrap_error" in report:
        fail(f"DistributedModelParallel(..., data_parallel_wrapper=...) raised {report['wrap_error']}",
             "wrap(dmp, env, device) gets the DMP; the model it shards is dmp._dmp_wrapped_module")
    tables = report["tables"]
    if any(t == "DTensor" for t in tables.values()):
        fail(
            "the embedding tables became DTensors: fully_shard reached the sharded EmbeddingBagCollection, and "
            "FSDP took each rank's shard of a table for a whole table to cut again",
            "call fully_shard on the dense modules only (model.dense_arch and model.over_arch of the DLRM inside "
            "dmp._dmp_wrapped_module), never on the whole model",
        )
    if "ShardedTensor" not in report["table_state"]:
        fail(f"no embedding table is a ShardedTensor in the state_dict any more ({', '.join(report['table_state'])})",
             "leave the tables to DMP: the wrapper handles the dense part only")
    dense = report["dense"]
    plain = [name for name, (kind, _) in dense.items() if kind != "DTensor"]
    if len(plain) == len(dense):
        if report["ddp"]:
            fail(
                "the dense part is wrapped in DDP: every rank holds a full replica of it (plain tensors) and "
                "all-reduces its gradients",
                "shard it instead: from torch.distributed.fsdp import fully_shard, then fully_shard(module) for "
                "each dense module",
            )
        fail(
            "the dense parameters are plain tensors and nothing synchronises them: every rank would train its "
            "own replica on its own data",
            "in wrap(), call fully_shard on each dense module of dmp._dmp_wrapped_module.model "
            "(dense_arch, over_arch)",
        )
    if plain:
        shown = sorted({".".join(name.split(".")[:2]) for name in plain})
        fail(f"{', '.join(plain)} {'is' if len(plain) == 1 else 'are'} still plain tensors",
             f"shard every dense module, not only some: {', '.join(shown)} too")
    wrong = sorted({placement for kind, placement in dense.values() if placement != "(Shard(dim=0),)"})
    if wrong:
        fail(f"dense parameters are placed {', '.join(wrong)}, expected (Shard(dim=0),)",
             "use fully_shard over all ranks (the default mesh): each rank keeps its rows of every parameter")
    _judge_start(reports)
    if "train_error" in report:
        fail(f"training the hybrid model failed: {report['train_error']}",
             "shard in place with fully_shard; DMP calls wrap() once, after building the fused tables' optimizer and before you build the dense one")
    losses = report["losses"]
    head, tail = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    if not tail < head:
        fail(f"the loss did not fall in {len(losses)} steps ({head:.3f} -> {tail:.3f})",
             "the dense parameters must be the ones the model uses: shard the modules in place")
    ops = report["ops"]
    if "all_reduce" in ops:
        fail("a training step all-reduced gradients: part of the dense model is still data-parallel (DDP)",
             "with FSDP the dense gradients are reduce-scattered, not all-reduced")
    if not {"all_gather", "reduce_scatter"} <= set(ops):
        fail(f"a training step ran {', '.join(ops)}, but no all-gather and reduce-scatter",
             "fully_shard makes FSDP all-gather the parameters before use and reduce-scatter the gradients")
    passed(
        f"tables stay TorchRec shards, {len(dense)} dense parameters are Shard(0) DTensors holding rank 0's initial "
        f"weights on every rank, and the {len(report['before_buffers'])} BatchNorm buffers are rank 0's; one step ran "
        f"{', '.join(ops)}; loss {head:.3f} -> {tail:.3f} in {len(losses)} steps"
    )


# ------------------------------------------------------------------------------------------ exercise 2


def dense_shapes(hidden: int = BYTES_HIDDEN) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every dense parameter of the lab's DLRM with MLPs `hidden` wide (built on meta)."""
    from course_lib import models

    model = models.click_dlrm(_CHECK_CONFIG.tables(16), _CHECK_CONFIG.num_dense, hidden=hidden, device="meta")
    return {name: tuple(p.shape) for name, p in model.named_parameters() if "embedding_bags" not in name}


def _measure_dense(hidden: int) -> int:
    """On each rank: the hybrid DLRM with `hidden`-wide MLPs, one Adam step, dense bytes held by this rank."""
    import torch
    import torch.distributed as dist

    from course_lib import hybrid, models, training

    torch.manual_seed(0)
    model = models.click_dlrm(_CHECK_CONFIG.tables(16), _CHECK_CONFIG.num_dense, hidden=hidden, device="meta")
    dmp = hybrid.shard_hybrid(model)
    optimizer = hybrid.hybrid_optimizer(dmp)
    split = data.make_click_log(data.ClickLogConfig(num_train=2_048, num_test=1_024, seed=5)).train
    training.train(dmp, optimizer, split, 64, max_steps=1, desc=None)
    return hybrid.memory_by_part(dmp, optimizer)["dense"].total


@functools.lru_cache(maxsize=None)
def measured_dense_bytes(world_size: int, hidden: int = BYTES_HIDDEN) -> tuple[int, ...]:
    """Bytes of dense parameters + gradients + Adam state held by each rank of the hybrid model (FSDP2, fp32)."""
    from course_lib import launch

    return tuple(launch_quietly(launch, _measure_dense, hidden, world_size=world_size, timeout=_TIMEOUT_S))


def _bytes_hint(got: float, want: int, shapes: Mapping[str, tuple[int, ...]], world_size: int, rank: int) -> str:
    import math

    numel = sum(math.prod(s) for s in shapes.values())
    if got == 16 * numel:
        return "that is what every rank holds under DDP (a full replica); FSDP2 keeps only each rank's rows"
    if abs(got - 16 * numel / world_size) < 1:
        return ("an even split is not what FSDP2 does: it cuts dim 0 with torch.chunk, so a parameter whose rows do "
                "not divide by the ranks leaves the last ranks fewer rows, and a 1-row parameter lives on rank 0 only")
    if got * 4 == want:
        return "count the gradient (4 bytes) and Adam's two states (8 bytes) as well as the parameter (4 bytes)"
    spread = sum(16 * (s[0] // world_size + (rank < s[0] % world_size)) * math.prod(s[1:]) for s in shapes.values())
    if got == spread:
        return ("that spreads the remainder rows one each over the first ranks (numpy.array_split); torch.chunk "
                "gives ceil(rows / ranks) rows to each rank in turn until the rows run out (16 rows on 3 ranks: "
                "6, 6, 4, not 6, 5, 5)")
    if got * 16 == want * 12:
        return ("count the gradient too: after backward each rank keeps its shard of every gradient (param 4 + "
                "grad 4 + Adam's two states 8 = 16 bytes a value)")
    ceil = sum(16 * math.ceil(s[0] / world_size) * math.prod(s[1:]) for s in shapes.values())
    if got == ceil:
        return ("not every rank gets ceil(rows / ranks) rows: torch.chunk gives that many to the first ranks and "
                "what is left to the next; a rank can get none")
    return "per parameter: the rows this rank keeps (torch.chunk(rows, ranks)) × the other dims × 16 bytes (fp32 Adam)"


# Shapes the lab never shows, on a world size the measurements do not use: FSDP2's torch.chunk gives 5 rows
# 2, 2, 1, 0 on 4 ranks, 7 rows 2, 2, 2, 1, a 1-row parameter to rank 0 alone. An answer that reads another
# tower than its `shapes` argument, or looks the measured numbers up, is right for the check's tower only; a
# 3-D parameter (a conv's weight, say: the row holds 2 x 2 values) catches a row size read as shape[1].
_FRESH_SHAPES: dict[str, tuple[int, ...]] = {"a": (5, 3), "b": (1,), "c": (7,), "d": (2, 2), "e": (3, 2, 2)}
_FRESH_WORLD_SIZE = 4


def _chunk_bytes(shapes: Mapping[str, tuple[int, ...]], world_size: int, rank: int) -> int:
    """The reference, without a launch: 16 bytes (fp32 param, grad, Adam's two states) per value of the rows
    torch.chunk gives `rank` of each parameter's dim 0."""
    import math

    import torch

    total = 0
    for shape in shapes.values():
        chunks = torch.arange(shape[0]).chunk(world_size)
        rows = len(chunks[rank]) if rank < len(chunks) else 0
        total += 16 * rows * math.prod(shape[1:])
    return total


def _check_fresh_shapes(predict: Callable[[Mapping[str, tuple[int, ...]], int, int], Any]) -> None:
    """Fail unless `predict` gives the torch.chunk bytes for ``_FRESH_SHAPES`` on every rank of
    ``_FRESH_WORLD_SIZE``."""
    tower = dense_shapes()
    for rank in range(_FRESH_WORLD_SIZE):
        call = f"fsdp_dense_bytes({_FRESH_SHAPES}, {_FRESH_WORLD_SIZE}, {rank})"
        try:
            got = checked_call("fsdp_dense_bytes", predict, dict(_FRESH_SHAPES), _FRESH_WORLD_SIZE, rank)
        except NotImplementedError:
            fail("fsdp_dense_bytes is not written yet", "replace `raise NotImplementedError()` with your code")
        except CheckFailed:
            raise
        except Exception as error:
            fail(f"{call} raised {one_line(error)}: the formula is right for the check's tower only",
                 "compute from the shapes argument, for any world_size and rank")
        want = _chunk_bytes(_FRESH_SHAPES, _FRESH_WORLD_SIZE, rank)
        if not is_number(got) or got != want:
            ignored = is_number(got) and got == _chunk_bytes(tower, _FRESH_WORLD_SIZE, rank)
            flat = {name: shape[:2] for name, shape in _FRESH_SHAPES.items()}  # a row's size read as shape[1]
            if not ignored and is_number(got) and got == _chunk_bytes(flat, _FRESH_WORLD_SIZE, rank):
                fail(f"{call} = {got!r}; FSDP2 (torch.chunk) keeps {want:,} bytes there: the 3-D parameter 'e' "
                     f"{_FRESH_SHAPES['e']} was counted as if its rows held shape[1] values",
                     "a row of a parameter holds every value of its other dims: math.prod(shape[1:]), not shape[1]")
            fail(
                f"{call} = {got!r}; FSDP2 (torch.chunk) keeps {want:,} bytes there: the formula is right for the "
                "measured tower only, so the lab's next cell (another width) would print the wrong numbers",
                "use the shapes argument: that is the check's own tower's answer, whatever shapes it is given"
                if ignored else (_bytes_hint(got, want, _FRESH_SHAPES, _FRESH_WORLD_SIZE, rank) if is_number(got)
                                 else "return a number of bytes"),
            )


@exercise
def check_dense_bytes(predict: Callable[[Mapping[str, tuple[int, ...]], int, int], Any]) -> None:
    """Compare `predict(shapes, world_size, rank)` with the dense bytes measured on each of 2 and 3 ranks, then
    (no launch) with torch.chunk's split of shapes the lab does not show (``_FRESH_SHAPES``) on 4 ranks."""
    shapes = dense_shapes()
    predictions: dict[int, list[float]] = {}
    for world_size in (2, 3):  # the learner's answers first: a wrong type fails before any launch
        predictions[world_size] = []
        for rank in range(world_size):
            try:
                got = checked_call("fsdp_dense_bytes", predict, dict(shapes), world_size, rank)
            except NotImplementedError:
                fail("fsdp_dense_bytes is not written yet", "replace `raise NotImplementedError()` with your code")
            if not is_number(got):
                fail(f"fsdp_dense_bytes returned {got!r}", "return a number of bytes")
            predictions[world_size].append(got)
    for world_size, per_rank in predictions.items():
        measured = measured_dense_bytes(world_size)
        for rank, (got, want) in enumerate(zip(per_rank, measured)):
            if got != want:
                fail(
                    f"a {BYTES_HIDDEN}-wide dense tower on {world_size} ranks: you predicted {got:,.0f} bytes on rank "
                    f"{rank}, measured {want:,}",
                    _bytes_hint(got, want, shapes, world_size, rank),
                )
    _check_fresh_shapes(predict)
    shown = ", ".join(f"{n:,}" for n in measured_dense_bytes(3))
    passed(f"your formula matches the dense bytes measured on every rank of 2 and 3 (on 3 ranks: {shown})")
