"""Checks for 06_fsdp: shard a transformer with FSDP2, and predict the bytes each rank holds.

`check_shard` runs the learner's `shard(model)` on 2 ranks and looks at what it did: which modules became
FSDP groups, which parameters became DTensors, how many all-gathers one forward ran, and whether a training
step still works. `check_bytes_prediction` compares the learner's formula with bytes measured on 2 and 4
ranks for a model whose size the learner has not seen.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping

from course_lib.checks import exercise, fail, launch_quietly, one_line, passed

_TIMEOUT_S = 60.0
# The model the shard exercise hands to `shard`: 3 blocks, so "one group per block plus the root" is 4.
SHARD_MODEL = {"vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 3, "max_seq_len": 16}
# The model whose bytes the prediction exercise measures: every first dimension divides by 4 ranks.
BYTES_MODEL = {"vocab_size": 128, "d_model": 48, "n_heads": 4, "n_layers": 2, "max_seq_len": 32}
_KEYS = ("params", "grads", "optimizer")


# ------------------------------------------------------------------------------------------ shard


def _inspect_sharding(shard: Callable[[Any], Any]) -> dict[str, Any]:
    """On each rank: build the exercise model, call `shard` on it, describe the result, train one step."""
    import torch

    from course_lib import trace
    from course_lib.fsdp import fsdp_groups, is_sharded
    from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

    torch.manual_seed(0)
    model = TinyTransformer(**SHARD_MODEL)
    try:
        returned = shard(model)
    except NotImplementedError:
        raise
    except Exception as error:  # noqa: BLE001  (what it had done by then tells why)
        return {"groups": fsdp_groups(model), "plain": [], "shard_error": one_line(error)}
    report: dict[str, Any] = {}
    if isinstance(returned, torch.nn.Module) and returned is not model:
        report["returned another module"] = type(returned).__name__
        model = returned
    report |= {
        "groups": fsdp_groups(model),
        "plain": [name for name, p in model.named_parameters() if not is_sharded(p)],
    }
    tokens = counting_tokens(4, SHARD_MODEL["max_seq_len"], SHARD_MODEL["vocab_size"])
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with trace.collectives() as log:
            with log.phase("forward"):
                loss = next_token_loss(model(tokens), tokens)
            with log.phase("backward"):
                loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
    except Exception as error:  # noqa: BLE001  (reported after the structural checks)
        report["train_error"] = one_line(error)
        return report
    report["forward_all_gathers"] = sum(1 for r in log.records if r.phase == "forward" and r.op == "all_gather")
    report["backward_all_gathers"] = sum(1 for r in log.records if r.phase == "backward" and r.op == "all_gather")
    report["backward_reduce_scatters"] = sum(
        1 for r in log.records if r.phase == "backward" and r.op == "reduce_scatter"
    )
    report["updated"] = all(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    return report


@exercise
def check_shard(shard: Callable[[Any], Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """Run `shard(model)` on 2 ranks with a 3-block TinyTransformer and check it is sharded FSDP2-style."""
    from course_lib.launcher.launch import LaunchError

    if launch is None:
        from course_lib import launch
    try:
        report = launch_quietly(launch, _inspect_sharding, shard, world_size=2, timeout=_TIMEOUT_S)[0]
    except LaunchError as error:
        raised = [f for f in error.failures if f.kind == "raised"]
        if raised and all(f.exc_type == "NotImplementedError" for f in raised):
            fail("shard is not written yet", "replace `raise NotImplementedError()` with your code")
        first = error.failures[0].headline() if error.failures else error.summary
        fail(
            f"shard(model) failed on 2 ranks: {first}",
            "run it yourself to read the traceback: "
            "launch(lambda: shard(TinyTransformer(**lab06.SHARD_MODEL)), world_size=2)",
        )
    blocks = [f"layers.{i}" for i in range(SHARD_MODEL["n_layers"])]
    groups, plain = report["groups"], report["plain"]
    if "shard_error" in report:
        if "" in groups:
            fail(
                f"shard(model) raised {report['shard_error']} after the root was sharded",
                "call fully_shard bottom-up: each block first, the root last (the root's group takes every "
                "parameter not yet in a group, so nothing is left for blocks sharded after it)",
            )
        fail(
            f"shard(model) raised {report['shard_error']}",
            "run it yourself to read the traceback: "
            "launch(lambda: shard(TinyTransformer(**lab06.SHARD_MODEL)), world_size=2)",
        )
    if not groups:
        fail(
            "no parameter is sharded: every rank still holds the whole model",
            "call fully_shard (from torch.distributed.fsdp) on each block of model.layers, then on model",
        )
    missing = [b for b in blocks if b not in groups]
    extra = [g for g in groups if g != "" and g not in blocks]
    if "" in groups and missing == blocks and not extra:
        ran = report.get("forward_all_gathers")
        fail(
            "only the root was sharded: it is one group, so "
            + (f"one forward ran {ran} all-gather for the whole model and " if ran is not None else "")
            + "every rank holds all the full parameters at once",
            "call fully_shard on each block of model.layers first, then on the model: one group per block means "
            "only one block's full parameters exist at a time",
        )
    if extra:
        shown = ", ".join(repr(g) for g in extra[:4]) + (", ..." if len(extra) > 4 else "")
        fail(
            f"{shown} {'is a group' if len(extra) == 1 else 'are groups'} of its own besides the blocks and the "
            "root: every group is one more all-gather per forward and one more reduce-scatter per backward",
            "one fully_shard per block of model.layers, then one on the model; the root's group takes the rest",
        )
    if missing:
        fail(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not a group of its own "
            f"(groups: {', '.join(repr(g) for g in groups)})",
            "loop over model.layers and call fully_shard on each block",
        )
    if "" not in groups:
        shown = ", ".join(plain[:3]) + (", ..." if len(plain) > 3 else "")
        fail(
            f"the root is not sharded: {shown} are still plain tensors, whole on every rank",
            "after the blocks, call fully_shard(model): the root's group takes the parameters no block claimed "
            "(embeddings, final norm, output head)",
        )
    if plain:
        fail(f"{', '.join(plain)} are not sharded", "every parameter should be a DTensor after fully_shard")
    if "returned another module" in report:
        fail(
            f"shard(model) returned another module (a {report['returned another module']}) instead of sharding "
            "the model it was given",
            "fully_shard changes `model` in place; shard it, and do not copy it or build a new one",
        )
    if "train_error" in report:
        fail(f"a training step on the sharded model failed: {report['train_error']}",
             "shard the model in place with fully_shard, then train it as usual")
    expected = len(blocks) + 1
    if report["forward_all_gathers"] != expected:
        fail(
            f"one forward ran {report['forward_all_gathers']} all-gathers, expected {expected} "
            "(one per block, one for the root)",
            "call fully_shard bottom-up: each block first, the root last",
        )
    if report["backward_all_gathers"] < len(blocks):  # the root may reshard too (explicit True): one more
        fail(
            f"one backward ran {report['backward_all_gathers']} all-gathers, expected {len(blocks)} (each block's "
            "parameters gathered again): blocks kept their full parameters from forward to backward",
            "leave reshard_after_forward at its default (True): that is what frees each block's full parameters "
            "after its forward, the memory FSDP saves",
        )
    if not report["updated"]:
        fail(
            "an optimizer built after shard(model) did not update every parameter",
            "shard must not copy or replace the model: shard it in place (fully_shard changes `model` itself)",
        )
    passed(
        f"{len(blocks)} blocks and the root are FSDP groups: {expected} all-gathers per forward, "
        f"{report['backward_reduce_scatters']} reduce-scatters per backward, every parameter a DTensor"
    )


# ------------------------------------------------------------------------------------- bytes


def _measure_fsdp_adam() -> dict[str, int]:
    """On each rank: the BYTES_MODEL sharded block by block, one Adam step, bytes held by this rank."""
    import torch
    import torch.distributed as dist

    from course_lib import memory
    from course_lib.fsdp import parallelize
    from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

    torch.manual_seed(0)
    model = parallelize(TinyTransformer(**BYTES_MODEL))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    tokens = counting_tokens(dist.get_world_size(), 8, BYTES_MODEL["vocab_size"])[dist.get_rank()::dist.get_world_size()]
    next_token_loss(model(tokens), tokens).backward()
    optimizer.step()
    return memory.measure(model, optimizer).as_dict()


@functools.lru_cache(maxsize=None)
def measured_bytes(world_size: int) -> tuple[int, dict[str, int]]:
    """(number of parameters, bytes held by rank 0) for BYTES_MODEL under FSDP2 + Adam on `world_size` ranks."""
    from course_lib import launch, memory
    from course_lib.models import TinyTransformer

    num_params = memory.count_params(TinyTransformer(**BYTES_MODEL, device="meta"))
    per_rank = launch_quietly(launch, _measure_fsdp_adam, world_size=world_size, timeout=_TIMEOUT_S)
    return num_params, per_rank[0]


def _bytes_hint(key: str, got: float, num_params: int, world_size: int) -> str:
    per_param = {"params": 4, "grads": 4, "optimizer": 8}[key]
    if got == per_param * num_params and world_size > 1:
        return (
            "that is what every rank holds under DDP; with full sharding (ZeRO-3) each rank keeps only "
            "1/world_size of it"
        )
    if key == "optimizer" and got * 2 == per_param * num_params / world_size:
        return "Adam keeps two fp32 tensors per parameter (exp_avg and exp_avg_sq), not one"
    if key == "optimizer" and got == 12 * num_params / world_size:
        return "no fp32 master copy here: the parameters are fp32 already, so Adam adds just its two states"
    if key == "optimizer" and got == 16 * num_params / world_size:
        return "count the optimizer state alone: params and grads have their own entries"
    if got * world_size * 4 == per_param * num_params:
        return "that counts values, not bytes: fp32 is 4 bytes per value"
    return f"{key}: bytes per value × values per parameter × parameters ÷ ranks"


@exercise
def check_bytes_prediction(predict: Callable[[int, int], Mapping[str, float]]) -> None:
    """Compare `predict(num_params, world_size)` with bytes measured under FSDP2 + Adam on 2 and 4 ranks."""
    from course_lib import memory
    from course_lib.models import TinyTransformer

    num_params = memory.count_params(TinyTransformer(**BYTES_MODEL, device="meta"))
    predictions = {}
    for world_size in (2, 4):  # the learner's answers first: a wrong shape fails before any launch
        try:
            got = predict(num_params, world_size)
        except NotImplementedError:
            fail("predict_fsdp_bytes is not written yet", "replace `raise NotImplementedError()` with your code")
        if not isinstance(got, Mapping) or not set(_KEYS) <= set(got):
            fail(f"predict returned {got!r}", f"return a dict with the keys {', '.join(map(repr, _KEYS))}")
        for key in _KEYS:
            if not isinstance(got[key], (int, float)) or isinstance(got[key], bool):
                fail(f"{key!r} is {got[key]!r}", "each entry is a number of bytes")
        predictions[world_size] = got
    for world_size, got in predictions.items():
        _, measured = measured_bytes(world_size)
        for key in _KEYS:
            if abs(got[key] - measured[key]) > 0.001 * measured[key]:
                fail(
                    f"{num_params:,} parameters on {world_size} ranks: you predicted {key}={got[key]:,.0f} bytes per "
                    f"rank, measured {measured[key]:,}",
                    _bytes_hint(key, got[key], num_params, world_size),
                )
    passed(
        f"your formula matches the bytes measured on 2 and 4 ranks ({num_params:,} parameters, "
        f"{measured['total']:,} bytes per rank on 4 ranks)"
    )
