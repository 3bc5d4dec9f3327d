"""Checks for 06_fsdp: shard a transformer with FSDP2, and predict the bytes each rank holds.

`check_shard` runs the learner's `shard(model)` on 2 ranks and looks at what it did: which modules became
FSDP groups, which parameters became DTensors, how many all-gathers one forward ran, and whether a training
step still works. `check_bytes_prediction` compares the learner's formula with bytes measured on 2 and 4
ranks for a model whose size the learner has not seen. `check_choose_layout` applies the learner's choice of
layout (FSDP over all ranks, HSDP, replication) to cases it has not seen, builds the 4-rank ones and judges
each by the bytes per rank and the time its collectives take; `check_build_on_mesh` runs the learner's
meta-device build on two different meshes.
"""
from __future__ import annotations

import functools
import json
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from course_lib.checks import (
    CheckFailed,
    checked_call,
    exercise,
    fail,
    is_number,
    launch_quietly,
    one_line,
    passed,
    raise_if_unwritten,
    same_start,
)

_TIMEOUT_S = 60.0
# The model the shard exercise hands to `shard` (a TiedEncoderDecoder): 2 + 3 blocks, none in `.layers`.
SHARD_MODEL = {"vocab_size": 64, "d_model": 32, "n_heads": 2, "n_encoder_layers": 2, "n_decoder_layers": 3,
               "max_seq_len": 16}
# The model whose bytes the prediction exercise measures: every first dimension divides by 4 ranks.
BYTES_MODEL = {"vocab_size": 128, "d_model": 48, "n_heads": 4, "n_layers": 2, "max_seq_len": 32}


# ------------------------------------------------------------------------------------------ shard


def _seq2seq_batch() -> tuple[Any, Any]:
    """Source and target of the shard exercise: the first and second halves of counting sequences."""
    from course_lib.models import counting_tokens

    length = SHARD_MODEL["max_seq_len"]
    tokens = counting_tokens(4, 2 * length, SHARD_MODEL["vocab_size"])
    return tokens[:, :length], tokens[:, length:]


def _inspect_sharding(shard: Callable[[Any], Any]) -> dict[str, Any]:
    """On each rank: build the exercise model, call `shard` on it, describe the result, train one step."""
    import torch

    from course_lib import trace
    from course_lib.fsdp import fsdp_groups, is_sharded
    from course_lib.models import TiedEncoderDecoder, next_token_loss

    torch.manual_seed(0)
    model = TiedEncoderDecoder(**SHARD_MODEL)
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
        "tied": model.lm_head.weight is model.shared.weight,
    }
    states: dict[int, list[str]] = {}  # fully_shard([a, b]) makes a and b one group: one state for both
    for name in report["groups"]:
        states.setdefault(id(model.get_submodule(name)._get_fsdp_state()), []).append(name)
    report["shared"] = [names for names in states.values() if len(names) > 1]
    source, target = _seq2seq_batch()
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        with trace.collectives() as log:
            with log.phase("forward"):
                loss = next_token_loss(model(source, target), target)
            # a group that reshards after its forward holds DTensor shards again; one that keeps its full
            # parameters (reshard_after_forward=False) holds plain tensors until its backward
            report["kept after forward"] = [
                name for name in report["groups"]
                if name and any(not is_sharded(p) for p in model.get_submodule(name).parameters())
            ]
            with log.phase("backward"):
                loss.backward()
        before = [p.detach().clone() for p in model.parameters()]
        optimizer.step()
    except Exception as error:  # noqa: BLE001  (reported after the structural checks)
        report["train_error"] = one_line(error)
        return report
    count = lambda phase, op: sum(1 for r in log.records if r.phase == phase and r.op == op)  # noqa: E731
    report["forward_all_gathers"] = count("forward", "all_gather")
    report["backward_all_gathers"] = count("backward", "all_gather")
    report["backward_reduce_scatters"] = count("backward", "reduce_scatter")
    report["updated"] = all(not torch.equal(a, p.detach()) for a, p in zip(before, model.parameters()))
    report["tied after a step"] = model.lm_head.weight is model.shared.weight
    return report


_TIED = ("shared", "lm_head")  # the two modules that hold the one tied matrix
_TRY_IT = ("try it before the check: launch(lambda: shard(TiedEncoderDecoder(**lab06.SHARD_MODEL)), world_size=2) "
           "shows the traceback")


@exercise
def check_shard(shard: Callable[[Any], Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """Run `shard(model)` on 2 ranks with a ``TiedEncoderDecoder(**SHARD_MODEL)`` and check it is sharded
    FSDP2-style: one group per block of ``encoder`` and ``decoder``, the tied ``shared`` / ``lm_head`` pair in
    one group (its own, or the root's), the root, every block resharding after its forward (the last decoder
    block may keep its parameters for the backward, as torchtitan does); then a training step, tie intact."""
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
        fail(f"shard(model) failed on 2 ranks: {first}", _TRY_IT)
    blocks = [f"encoder.{i}" for i in range(SHARD_MODEL["n_encoder_layers"])]
    blocks += [f"decoder.{i}" for i in range(SHARD_MODEL["n_decoder_layers"])]
    groups, plain = report["groups"], report["plain"]
    where = "the blocks are in model.encoder and model.decoder: print(model) to see them"
    if "shard_error" in report:
        if "layers" in report["shard_error"]:
            fail(f"shard(model) raised {report['shard_error']}: this model has no `layers`", where)
        if "containers that do not implement forward" in report["shard_error"]:
            fail(
                "fully_shard refused a ModuleList: a list has no forward, so FSDP has no hook that gathers its "
                "parameters before they are used",
                "shard each block in the list: for block in model.encoder: fully_shard(block); the same for decoder",
            )
        if "" in groups:
            fail(
                f"shard(model) raised {report['shard_error']} after the root was sharded",
                "call fully_shard bottom-up: each block first, the root last (the root's group takes every "
                "parameter not yet in a group, so nothing is left for blocks sharded after it)",
            )
        fail(f"shard(model) raised {report['shard_error']}", _TRY_IT)
    if not groups:
        fail("no parameter is sharded: every rank still holds the whole model",
             f"call fully_shard (from torch.distributed.fsdp) on each block, then on model; {where}")
    missing = [b for b in blocks if b not in groups]
    extra = [g for g in groups if g not in ("", *blocks, *_TIED)]
    if "" in groups and missing == blocks and not extra:
        fail(
            "only the root was sharded: it is one group, so every rank holds all the full parameters at once",
            f"call fully_shard on each block first, then on the model; {where}",
        )
    if extra:
        shown = ", ".join(repr(g) for g in extra[:4]) + (", ..." if len(extra) > 4 else "")
        fail(
            f"{shown} {'is a group' if len(extra) == 1 else 'are groups'} of its own besides the blocks, the tied "
            "pair and the root: a group is one all-gather of all its parameters at once",
            "one fully_shard per block (model.encoder[i], model.decoder[i], not the lists), then one on the model",
        )
    if missing:
        fail(
            f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not a group of its own "
            f"(groups: {', '.join(repr(g) for g in groups)})",
            f"call fully_shard on each block; {where}",
        )
    pair = [g for g in _TIED if g in groups]
    if "shared with a parameter already managed by another FSDP group" in report.get("train_error", ""):
        split = (f"{' and '.join(pair)} are two groups" if len(pair) == 2 else
                 f"{pair[0]} is a group and {({*_TIED} - {pair[0]}).pop()} is left to the root" if pair else
                 "they are in two groups")
        fail(
            f"shared.weight and lm_head.weight are one matrix, and it is split: {split}. Each group would all-gather "
            "and reduce-scatter the same matrix, so FSDP refused at the first forward",
            "put both modules in one group, fully_shard([model.shared, model.lm_head]), or leave both to the root",
        )
    if not report["tied"] or not report.get("tied after a step", True):
        fail(
            "lm_head.weight is no longer shared.weight: the model now has two matrices where it had one, and "
            "trains as a different model",
            "keep the tie: do not give lm_head a weight of its own; shard the two modules in one group instead",
        )
    others = [names for names in report["shared"] if set(names) != set(_TIED)]
    if others:
        fail(
            f"{', '.join(others[0])} are one FSDP group (fully_shard was given them together): one all-gather brings "
            "all their full parameters at once",
            "call fully_shard on each block by itself; only modules that share a parameter belong together",
        )
    if "" not in groups:
        shown = ", ".join(plain[:3]) + (", ..." if len(plain) > 3 else "")
        fail(
            f"the root is not sharded: {shown} are still plain tensors, whole on every rank",
            "after the blocks, call fully_shard(model): the root's group takes the parameters no group claimed "
            "(positions, the final norms, and the tied pair if it has no group of its own)",
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
    expected = len(blocks) + 1 + (1 if pair else 0)
    if report["forward_all_gathers"] != expected:
        fail(
            f"one forward ran {report['forward_all_gathers']} all-gathers, expected {expected} "
            f"(one per block, {'one for the tied pair, ' if pair else ''}one for the root)",
            "call fully_shard bottom-up: each block first, the root last",
        )
    early = [name for name in report["kept after forward"] if name not in (blocks[-1], *_TIED)]
    if early or report["backward_all_gathers"] < len(blocks) - 1:
        early = early or blocks[:-1]
        fail(
            f"{', '.join(early)} kept {'its' if len(early) == 1 else 'their'} full parameters after "
            f"{'its' if len(early) == 1 else 'their'} forward (reshard_after_forward=False): they stay allocated "
            "while every later block runs its forward and its backward, the memory FSDP saves; only the last block "
            f"({blocks[-1]}), whose backward starts right after the forward, gains by keeping them",
            "leave reshard_after_forward at its default (True) on every block; torchtitan sets False on the last "
            "block only",
        )
    if not report["updated"]:
        fail(
            "an optimizer built after shard(model) did not update every parameter",
            "shard must not copy or replace the model: shard it in place (fully_shard changes `model` itself)",
        )
    passed(
        f"{len(blocks)} blocks, {'the tied pair and ' if pair else ''}the root are FSDP groups, the tie kept: "
        f"{expected} all-gathers per forward (the shared matrix once, though two modules use it), "
        f"{report['backward_reduce_scatters']} reduce-scatters per backward"
    )


# ------------------------------------------------------------------------------------- bytes

# The settings the prediction exercise measures: (reshard_after_forward, param_dtype), the same on every group.
HELD_CASES = ((False, "bfloat16"), (True, "bfloat16"), (False, "float32"), (True, "float32"))


def _measure_held(cases: tuple[tuple[bool, str], ...]) -> list[dict[str, int]]:
    """On each rank, for each case: the BYTES_MODEL sharded with that setting, one Adam step, zero_grad, the next
    forward; the bytes this rank holds then, before that backward."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from course_lib.fsdp import held_bytes, parallelize
    from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

    rank, world_size = dist.get_rank(), dist.get_world_size()
    tokens = counting_tokens(2 * world_size, 8, BYTES_MODEL["vocab_size"])[rank::world_size]
    held = []
    for reshard_after_forward, dtype in cases:
        torch.manual_seed(0)
        policy = MixedPrecisionPolicy(param_dtype=getattr(torch, dtype))
        model = parallelize(TinyTransformer(**BYTES_MODEL), reshard_after_forward=reshard_after_forward,
                            mp_policy=policy)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        next_token_loss(model(tokens), tokens).backward()
        optimizer.step()
        optimizer.zero_grad()
        loss = next_token_loss(model(tokens), tokens)
        held.append(held_bytes(model, optimizer))
        loss.backward()
    return held


@functools.lru_cache(maxsize=None)
def measured_bytes(world_size: int) -> tuple[int, dict[tuple[bool, str], dict[str, int]]]:
    """(number of parameters, {case: bytes held by rank 0 between forward and backward}) for BYTES_MODEL on
    `world_size` ranks, for each of HELD_CASES."""
    from course_lib import launch, memory
    from course_lib.models import TinyTransformer

    num_params = memory.count_params(TinyTransformer(**BYTES_MODEL, device="meta"))
    per_rank = launch_quietly(launch, _measure_held, HELD_CASES, world_size=world_size, timeout=_TIMEOUT_S)
    return num_params, dict(zip(HELD_CASES, per_rank[0]))


def _want(num_params: int, world_size: int, reshard_after_forward: bool, dtype: str) -> dict[str, float]:
    """What the check expects: the course's accounting of what a rank holds between forward and backward."""
    import torch

    return {"sharded params": 4 * num_params / world_size,
            "full params": 0 if reshard_after_forward else getattr(torch, dtype).itemsize * num_params,
            "grads": 0, "optimizer": 8 * num_params / world_size}


def _bytes_hint(key: str, got: float, num_params: int, world_size: int, reshard_after_forward: bool,
                dtype: str) -> str:
    n, w = num_params, world_size
    same = lambda a, b: abs(a - b) <= 0.001 * max(abs(b), 1)  # noqa: E731
    size = 2 if dtype == "bfloat16" else 4
    if key == "sharded params":
        if same(got, 2 * n / w):
            return "the shards stay fp32 under MixedPrecisionPolicy: only the all-gathered copies are in param_dtype"
        if got == 0:
            return ("FSDP keeps the shards while the full parameters exist: the optimizer steps the shards, and "
                    "the full copies are freed after backward")
        if same(got, 4 * n):
            return "each rank keeps 1/world_size of every parameter: that is what sharding means"
    if key == "full params":
        if reshard_after_forward and got:
            return ("reshard_after_forward=True on every group, the root too: each frees its full parameters "
                    "right after its forward, so none are left before the backward")
        if not reshard_after_forward and got == 0:
            return "reshard_after_forward=False keeps each group's full parameters from its forward to its backward"
        if not reshard_after_forward and same(got, size * n / w):
            return "the full parameters are whole on every rank: every parameter, not 1/world_size of it"
        if not reshard_after_forward and size == 2 and same(got, 4 * n):
            return "param_dtype=torch.bfloat16: the all-gather casts each shard to bf16, 2 bytes a value"
        if not reshard_after_forward and size == 4 and same(got, 2 * n):
            return "param_dtype=torch.float32 here: no cast, the full parameters are fp32, 4 bytes a value"
        if not reshard_after_forward and same(got, (size + 4) * n):
            return "count the shards under \"sharded params\" only: FSDP keeps them beside the full parameters"
    if key == "grads" and got:
        return ("optimizer.zero_grad() sets every gradient to None (set_to_none=True), and this step's backward has "
                "not run yet: no gradient exists")
    if key == "optimizer":
        if same(got, 4 * n / w):
            return "Adam keeps two fp32 tensors per parameter (exp_avg and exp_avg_sq), not one"
        if same(got, 8 * n):
            return "Adam's state follows the shards: each rank keeps 1/world_size of it"
    if same(got * 4, _want(n, w, reshard_after_forward, dtype)[key]) or same(got * size, _want(n, w, reshard_after_forward, dtype)[key]):
        return "that counts values, not bytes: fp32 is 4 bytes a value, bf16 2"
    return f"{key}: bytes per value × values held; sections 4 and 6 say what is kept and in which dtype"


def _case(reshard_after_forward: bool, dtype: str) -> str:
    return f"reshard_after_forward={reshard_after_forward}, param_dtype=torch.{dtype}"


_KEYS = ("sharded params", "full params", "grads", "optimizer")


def _ask(predict: Callable[..., Any], num_params: int, world_size: int, case: tuple[bool, str]) -> Mapping[str, float]:
    import torch

    reshard_after_forward, dtype = case
    try:
        got = checked_call("predict_held_bytes", predict, num_params, world_size, reshard_after_forward,
                           getattr(torch, dtype))
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as error:  # noqa: BLE001  (the learner's code: report it)
        fail(f"predict_held_bytes({num_params:,}, {world_size}, {reshard_after_forward}, torch.{dtype}) raised "
             f"{one_line(error)}", "param_dtype is a torch.dtype: torch.bfloat16.itemsize is 2")
    if not isinstance(got, Mapping) or not set(_KEYS) <= set(got):
        fail(f"predict_held_bytes returned {got!r}", f"return a dict with the keys {', '.join(map(repr, _KEYS))}")
    for key in _KEYS:
        if not is_number(got[key]):
            fail(f"{key!r} is {got[key]!r}", "each entry is a number of bytes")
    return got


@exercise
def check_bytes_prediction(predict: Callable[..., Mapping[str, float]]) -> None:
    """Compare `predict(num_params, world_size, reshard_after_forward, param_dtype)` with the bytes rank 0 holds
    between the forward and the backward of a second step, measured for each of HELD_CASES on 2 and 4 ranks; then
    (no launch) with the accounting for a model and a world size the check does not measure (``_FRESH_BYTES``)."""
    from course_lib import memory
    from course_lib.models import TinyTransformer

    num_params = memory.count_params(TinyTransformer(**BYTES_MODEL, device="meta"))
    predictions = {(w, case): _ask(predict, num_params, w, case) for w in (2, 4) for case in HELD_CASES}
    for (world_size, case), got in predictions.items():  # the learner's answers first: a wrong shape fails early
        measured = measured_bytes(world_size)[1][case]
        for key in _KEYS:
            if abs(got[key] - measured[key]) > 0.001 * max(measured[key], 1):
                fail(
                    f"{num_params:,} parameters on {world_size} ranks, {_case(*case)}: you predicted "
                    f"{key}={got[key]:,.0f} bytes per rank between forward and backward, measured {measured[key]:,}",
                    _bytes_hint(key, got[key], num_params, world_size, *case),
                )
    _check_fresh_bytes(predict)
    peak = measured_bytes(4)[1][(False, "float32")]
    passed(
        f"your formula matches the bytes measured on 2 and 4 ranks in all {len(HELD_CASES)} settings "
        f"({num_params:,} parameters: on 4 ranks in fp32, {sum(peak.values()):,} bytes a rank with "
        f"reshard_after_forward=False, {sum(measured_bytes(4)[1][(True, 'float32')].values()):,} with True)"
    )


# A model size and a world size the check does not measure (it divides evenly, as the measured model does): an
# answer that reads the measured model instead of its `num_params`, or looks up the measured numbers (the
# failure messages print them), is right for that model only.
_FRESH_BYTES = (1_000_000, 8)


def _check_fresh_bytes(predict: Callable[..., Mapping[str, float]]) -> None:
    """Fail unless `predict` gives the accounting's bytes for each of HELD_CASES on ``_FRESH_BYTES``."""
    num_params, world_size = _FRESH_BYTES
    for case in HELD_CASES:
        call = f"predict_held_bytes({num_params:,}, {world_size}, {case[0]}, torch.{case[1]})"
        want = _want(num_params, world_size, *case)
        try:
            got = _ask(predict, num_params, world_size, case)
        except CheckFailed as failure:
            fail(f"{failure.problem}: the formula is right for the measured model only",
                 "compute from the arguments, for any model and any number of ranks")
        for key in _KEYS:
            value = got[key]
            if abs(value - want[key]) > 0.001 * max(want[key], 1):
                hint = _bytes_hint(key, value, num_params, world_size, *case)
                if hint.startswith(f"{key}: "):  # no known mistake: the answer does not follow its arguments
                    hint = ("compute from the arguments, num_params and world_size: not from the model the check "
                            "measured or the numbers it printed")
                fail(f"{call} gives {key}={value:,.0f} bytes per rank; the accounting gives {want[key]:,.0f} there: "
                     "the formula is right for the measured model only", hint)


# ------------------------------------------------------------------------------- the layout decision

# The model every 4-rank case builds, and the model of the build exercise.
HSDP_MODEL = {"vocab_size": 64, "d_model": 32, "n_heads": 2, "n_layers": 2, "max_seq_len": 16}
STATE_BYTES = 16  # per parameter, fp32 + Adam: weight 4, gradient 4, exp_avg and exp_avg_sq 8 (section 7)
_KiB, _GiB = 2**10, 2**30
_LAYOUT_NAMES = ("FSDP over all ranks", "HSDP (shard within a host, replicate across hosts)", "replication")


@dataclass(frozen=True)
class Situation:
    """One case of the layout decision: the arguments of ``choose_layout`` and a description."""

    hosts: int
    ranks_per_host: int
    num_params: int
    memory_limit: int  # bytes of model state (parameters, gradients, Adam) a rank may hold
    intra_gbps: float  # GB/s a rank sends at inside its host
    cross_gbps: float  # GB/s a rank sends at over the link between hosts

    @property
    def world_size(self) -> int:
        return self.hosts * self.ranks_per_host

    def args(self) -> tuple:
        return (self.hosts, self.ranks_per_host, self.num_params, self.memory_limit, self.intra_gbps, self.cross_gbps)

    def describe(self) -> str:
        from course_lib.memory import format_bytes

        return (f"{self.hosts} host{'s' if self.hosts > 1 else ''} x {self.ranks_per_host} ranks, "
                f"{self.num_params:,} parameters, {format_bytes(self.memory_limit)} per rank, "
                f"{self.intra_gbps:g} GB/s inside a host, {self.cross_gbps:g} GB/s between hosts")


def _hsdp_params() -> int:
    from course_lib import memory
    from course_lib.models import TinyTransformer

    return memory.count_params(TinyTransformer(**HSDP_MODEL, device="meta"))


def layout_cases() -> list[Situation]:
    """The cases the check decides: 4 of 4 ranks (built and measured, HSDP_MODEL's parameters), then 10 larger
    ones judged by the same accounting from the layout alone."""
    n = _hsdp_params()  # 30,080: 470 KiB of state whole, 235 KiB sharded 2 ways, 117.5 KiB 4 ways
    return [
        Situation(1, 4, n, 512 * _KiB, 100, 12.5),   # it fits whole: replication sends least
        Situation(2, 2, n, 160 * _KiB, 100, 12.5),   # only 4-way sharding fits
        Situation(2, 2, n, 512 * _KiB, 100, 12.5),   # replication fits, HSDP is faster
        Situation(4, 1, n, 512 * _KiB, 100, 12.5),   # one rank per host: HSDP is replication
        Situation(4, 8, 3_000_000_000, 40 * _GiB, 150, 25),    # HSDP
        Situation(2, 4, 1_000_000_000, 3 * _GiB, 150, 25),     # only FSDP over all 8 fits
        Situation(1, 8, 1_000_000_000, 40 * _GiB, 150, 25),    # one host, fits whole: replication
        Situation(2, 8, 1_000_000_000, 40 * _GiB, 25, 25),     # PCIe GPUs, no NVLink: replication
        # HSDP fits, replication does not; equal links, yet HSDP beats FSDP over 8: its replicas all-reduce only
        # a 1/4 shard, and 4-way shard groups send 3/4 of the parameter bytes, not 7/8
        Situation(2, 4, 1_000_000_000, 6 * _GiB, 25, 25),
        Situation(2, 8, 1_000_000_000, 40 * _GiB, 150, 120),   # fits whole, a fast cross link: replication beats HSDP
        # 4-way shards hold exactly the limit (16 bytes x 1e9 / 4 = 4 GB): HSDP fits, and beats FSDP over 8; an
        # answer that wants a layout strictly under the limit picks FSDP
        Situation(2, 4, 1_000_000_000, 4_000_000_000, 150, 25),
        # fits whole, a cross link half as fast as inside a host: HSDP; replication wins only for an answer that
        # counts an all-reduce as sending the gradients once ((R-1)/R), not twice (reduce-scatter + all-gather)
        Situation(2, 8, 1_000_000_000, 40 * _GiB, 150, 75),
        # where it fits whole, replication beats HSDP exactly when the cross link is over 2/3 as fast as a host's
        # (both send 2 (S-1)/S of the parameter bytes more over one link than the other): just under (95), HSDP; just
        # over (105), replication. A cut-off typed in between the cases above (1/2, 3/4) picks wrong at one of them
        Situation(2, 8, 1_000_000_000, 40 * _GiB, 150, 95),
        Situation(2, 8, 1_000_000_000, 40 * _GiB, 150, 105),
    ]


def named_layouts(hosts: int, ranks_per_host: int) -> dict[str, Any]:
    """The three layouts of the exercise, as rank layouts (rows of a 2-D layout are shard groups)."""
    world = hosts * ranks_per_host
    return {
        _LAYOUT_NAMES[0]: list(range(world)),
        _LAYOUT_NAMES[1]: [[h * ranks_per_host + i for i in range(ranks_per_host)] for h in range(hosts)],
        _LAYOUT_NAMES[2]: [[r] for r in range(world)],
    }


def _groups(layout: list) -> tuple[list[list[int]], list[list[int]]]:
    """(shard groups, replicate groups) of a normalized layout: a 1-D layout shards over all its ranks."""
    if layout and isinstance(layout[0], list):
        return [list(row) for row in layout], [list(col) for col in zip(*layout)]
    return [list(layout)], [[r] for r in layout]


def _account(shard_groups: list[list[int]], replicate_groups: list[list[int]], s: Situation,
             state: float | None = None) -> dict[str, Any]:
    """The course's accounting: state per rank, bytes each rank sends per step in each group, and the time."""
    S, R = len(shard_groups[0]), len(replicate_groups[0])
    P = 4 * s.num_params  # fp32 parameter bytes
    shard_bytes = 3 * (S - 1) / S * P  # two all-gathers of the parameters, one reduce-scatter of the gradients
    replicate_bytes = 2 * (R - 1) / R * P / S  # one all-reduce of each rank's gradient shard
    spans = lambda group: len({r // s.ranks_per_host for r in group}) > 1  # noqa: E731
    crossing_shards = [g for g in shard_groups if S > 1 and spans(g)]
    crossing_replicas = [g for g in replicate_groups if R > 1 and spans(g)]
    speed = lambda crosses: (s.cross_gbps if crosses else s.intra_gbps) * 1e9  # noqa: E731
    seconds = max(shard_bytes / speed(spans(g)) for g in shard_groups) + max(
        replicate_bytes / speed(spans(g)) for g in replicate_groups)
    return {"S": S, "R": R, "state": STATE_BYTES * s.num_params / S if state is None else state,
            "seconds": seconds, "shard bytes": shard_bytes, "replicate bytes": replicate_bytes,
            "crossing shards": crossing_shards, "crossing replicas": crossing_replicas}


def _normalize_layout(got: Any, s: Situation) -> list | str:
    """The learner's layout as a list of ints or a list of equal rows; or what is wrong with it."""
    import operator

    try:
        import torch

        if isinstance(got, torch.Tensor):
            got = got.tolist()
    except ImportError:  # pragma: no cover
        pass
    if not isinstance(got, (list, tuple)) or not got:
        return f"returned {got!r}: return a list of ranks (1-D mesh) or a list of rows (2-D mesh: each row a shard group)"
    try:
        if all(isinstance(row, (list, tuple)) for row in got):
            layout: list = [[operator.index(r) for r in row] for row in got]
            if len({len(row) for row in layout}) != 1 or not layout[0]:
                return f"returned rows of lengths {[len(row) for row in layout]}: every row of a mesh has the same length"
            ranks = [r for row in layout for r in row]
        else:
            layout = [operator.index(r) for r in got]
            ranks = layout
    except TypeError:
        return (f"returned {got!r}: a layout holds rank numbers (ints), as a list (1-D mesh) or a list of rows "
                "(2-D mesh)")
    if sorted(ranks) != list(range(s.world_size)):
        return (f"returned a layout of ranks {sorted(ranks)[:8]}{' ...' if len(ranks) > 8 else ''}: this job has "
                f"{s.world_size} ranks, and a mesh lists each of 0..{s.world_size - 1} once")
    return layout


def _layout_on_rank(layouts: list[list]) -> list[dict[str, Any]]:
    """On each of 4 ranks: for each layout, a HSDP_MODEL sharded on its mesh, one Adam step, the bytes held."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    from course_lib import memory
    from course_lib.fsdp import parallelize
    from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

    rank, world = dist.get_rank(), dist.get_world_size()
    out = []
    for layout in layouts:
        two_d = isinstance(layout[0], list)
        mesh = DeviceMesh("cpu", layout, mesh_dim_names=("replicate", "shard") if two_d else None)
        torch.manual_seed(0)
        model = parallelize(TinyTransformer(**HSDP_MODEL), mesh=mesh)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        tokens = counting_tokens(world, 8, HSDP_MODEL["vocab_size"])[rank::world]
        next_token_loss(model(tokens), tokens).backward()
        optimizer.step()
        groups = [sorted(dist.get_process_group_ranks(mesh.get_group(d))) for d in range(mesh.ndim)]
        out.append({"state": memory.measure(model, optimizer).total, "shard group": groups[-1],
                    "replicate group": groups[0] if two_d else [rank]})
    return out


def _measure_layouts(layouts: list[list], launch: Callable[..., list[Any]]) -> list[dict[str, Any]]:
    """Per layout: the most state bytes any rank held, and the shard and replicate groups the ranks reported."""
    with warnings.catch_warnings():  # 4 ranks on fewer cores: fine for a check
        warnings.simplefilter("ignore", UserWarning)
        per_rank = launch(_layout_on_rank, layouts, world_size=4, backend="gloo", show_ranks=[], timeout=2 * _TIMEOUT_S)
    measured = []
    for i in range(len(layouts)):
        reports = [rank_reports[i] for rank_reports in per_rank]
        unique = lambda key: sorted({tuple(r[key]) for r in reports})  # noqa: E731
        measured.append({"state": max(r["state"] for r in reports),
                         "shard groups": [list(g) for g in unique("shard group")],
                         "replicate groups": [list(g) for g in unique("replicate group")]})
    return measured


def _seconds(t: float) -> str:
    return f"{t * 1e3:,.1f} ms" if t >= 1e-3 else f"{t * 1e6:,.2f} µs"


def _short(layout: list) -> str:
    text = str(layout)
    return text if len(text) <= 40 else text[:37] + "...]"


@exercise
def check_choose_layout(choose_layout: Callable[..., Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """Apply ``choose_layout(hosts, ranks_per_host, num_params, memory_limit, intra_gbps, cross_gbps)`` to 14
    cases the lab does not show, and judge each layout by its consequence.

    The 4 cases of 4 ranks are built: one launch of 4 ranks (gloo) shards ``TinyTransformer(**HSDP_MODEL)``
    on each layout's mesh, takes an Adam step, and reports the bytes of state each rank holds and the ranks
    of its shard and replicate groups. The 10 larger cases (8 to 32 ranks, models of billions of parameters)
    cannot run here: they are judged by the same accounting computed from the layout's shape: 16 bytes per
    parameter / the shard group's size, and per step 3 (S-1)/S of the parameter bytes sent in the shard group
    and 2 (R-1)/R of a shard's in the replicate group, at the cross-host speed if the group spans hosts.

    A layout passes when it fits the memory limit and its communication takes no longer than the fastest of
    the three named layouts (FSDP over all ranks, HSDP, replication) that fit.
    """
    if launch is None:
        from course_lib import launch
    from course_lib.launcher.launch import LaunchError
    from course_lib.memory import format_bytes

    cases = layout_cases()
    chosen = []
    for s in cases:  # every answer first: a wrong shape fails before any launch
        try:
            got = checked_call("choose_layout", choose_layout, *s.args())
        except CheckFailed:
            raise
        except Exception as error:  # noqa: BLE001
            raise_if_unwritten(error)
            fail(f"choose_layout raised {one_line(error)} for {s.describe()}")
        layout = _normalize_layout(got, s)
        if isinstance(layout, str):
            fail(f"for {s.describe()}, choose_layout {layout}",
                 "FSDP over all: list(range(world)); HSDP: one row per host; replication: one row per rank")
        chosen.append(layout)
    built = [layout for s, layout in zip(cases, chosen) if s.world_size == 4]
    distinct = [json.loads(text) for text in dict.fromkeys(json.dumps(layout) for layout in built)]
    try:
        measured = dict(zip(map(json.dumps, distinct), _measure_layouts(distinct, launch)))
    except LaunchError as error:
        first = error.failures[0].headline() if error.failures else error.summary
        fail(f"sharding a model on your layouts on 4 ranks failed: {first}", "return lists of ints, as in the lab")
    for s, layout in zip(cases, chosen):
        if s.world_size == 4:
            m = measured[json.dumps(layout)]
            mine = _account(m["shard groups"], m["replicate groups"], s, state=m["state"])
            how = "measured on 4 ranks"
        else:
            mine = _account(*_groups(layout), s)
            how = f"by the accounting: {s.world_size} ranks do not run here"
        if mine["state"] > s.memory_limit:
            fail(
                f"for {s.describe()}: your layout {_short(layout)} shards {mine['S']} way{'s' if mine['S'] > 1 else ''}"
                f" and holds {format_bytes(mine['state'])} per rank ({how}), over the {format_bytes(s.memory_limit)} "
                "limit",
                "a rank holds 16 bytes per parameter / the size of its shard group (memory.zero_bytes, stage 3, with "
                "world_size = the shard group): check each layout against the limit before comparing times",
            )
        options = {name: _account(*_groups(other), s) for name, other in named_layouts(s.hosts, s.ranks_per_host).items()}
        fitting = {name: a for name, a in options.items() if a["state"] <= s.memory_limit}
        best_name = min(fitting, key=lambda name: fitting[name]["seconds"])
        best = fitting[best_name]
        if mine["seconds"] <= best["seconds"] * (1 + 1e-9):
            continue
        why = []
        slow = s.cross_gbps < s.intra_gbps  # with equal links, spanning hosts costs nothing more
        if mine["crossing shards"] and slow:
            shown = ", ".join(map(str, mine["crossing shards"][:2])) + (", ..." if len(mine["crossing shards"]) > 2 else "")
            why.append(f"shard groups {shown} span hosts: every all-gather and reduce-scatter crosses the slow link")
        if mine["crossing replicas"] and mine["S"] == 1:
            why.append("every rank all-reduces all its gradients across hosts")
        elif mine["crossing replicas"] and best["S"] > mine["S"] and slow:
            why.append(f"replica groups such as {mine['crossing replicas'][0]} span hosts: each step all-reduces "
                       f"1/{mine['S']} of the gradients over the slow link, where {best['S']}-way shards would "
                       f"send 1/{best['S']}")
        if mine["S"] > 1 and best["S"] < mine["S"] and best["state"] == s.memory_limit:
            why.append(f"{best_name.split(' (')[0]} holds exactly the {format_bytes(s.memory_limit)} limit per "
                       "rank, and a layout that holds no more than the limit fits")
        if mine["S"] > 1 and best["S"] < mine["S"]:
            fits = "the whole model fits one rank" if best["S"] == 1 else f"{best['S']}-way fits"
            why.append(f"it shards {mine['S']} ways though {fits}: each rank sends "
                       f"{3 * (mine['S'] - 1)}/{mine['S']} of the parameter bytes per step in all-gathers and a "
                       "reduce-scatter")
        fail(
            f"for {s.describe()}: your layout {_short(layout)} fits ({format_bytes(mine['state'])} per rank) but its "
            f"communication takes {_seconds(mine['seconds'])} per step ({how}); {best_name} fits too and takes "
            f"{_seconds(best['seconds'])}" + (": " + "; ".join(why) if why else ""),
            "compute each layout's time (bytes sent in each group / the speed of the link that group uses) and "
            "keep the fastest that fits; a group spanning hosts runs at the cross-host speed",
        )
    on_four = sum(s.world_size == 4 for s in cases)
    passed(
        f"choose_layout fits the memory limit and its communication takes the least time in all {len(cases)} cases "
        f"({on_four} measured on 4 ranks, {len(cases) - on_four} of up to {max(s.world_size for s in cases)} ranks "
        "by the accounting)"
    )


# ------------------------------------------------------------------------------ build on a given mesh

HOSTS = ((0, 1), (2, 3))  # the hosts the build check pretends its 4 ranks sit on (2 hosts x 2)
_HSDP_STEPS = 3


def _placements(model: Any) -> list[str]:
    from course_lib.fsdp import is_sharded

    return sorted({str(p.placements) if is_sharded(p) else "plain tensor" for p in model.parameters()})


def _build_on_rank(build: Callable[[Any], Any]) -> dict[str, Any]:
    """On each of 4 ranks: the learner's model on a 2 x 2 HSDP mesh, then on a 1-D mesh of 4; what they are;
    3 SGD steps of the first against one process."""
    import torch
    import torch.distributed as dist
    import torch.distributed.fsdp
    from torch.distributed.device_mesh import DeviceMesh

    from course_lib import memory
    from course_lib.fsdp import fsdp_groups, full_parameters, is_sharded
    from course_lib.models import TinyTransformer, counting_tokens, next_token_loss

    rank = dist.get_rank()
    mesh = DeviceMesh("cpu", [list(host) for host in HOSTS], mesh_dim_names=("replicate", "shard"))
    flat = DeviceMesh("cpu", list(range(dist.get_world_size())))
    report: dict[str, Any] = {}
    built: list[list[str]] = []  # the devices of each TinyTransformer build makes, as it is made
    make = TinyTransformer.__init__

    def recording_init(self: Any, *args: Any, **kwargs: Any) -> None:
        make(self, *args, **kwargs)
        built.append(sorted({p.device.type for p in self.parameters()}))

    whole: list[str] = []  # parameters that to_empty allocated before fully_shard cut them
    materialize = torch.nn.Module.to_empty

    def recording_to_empty(self: Any, *args: Any, **kwargs: Any) -> Any:
        whole.extend(name for name, p in self.named_parameters() if p.is_meta and not is_sharded(p))
        return materialize(self, *args, **kwargs)

    # parameters fully_shard was given already allocated: a model that reached it whole some other way (a copy
    # of one built earlier, a state dict loaded with assign=True); read where the stub imports it, at call time
    given_whole: list[tuple[Any, str, str]] = []  # (the module given, the parameter's name in it, its device)
    shard = torch.distributed.fsdp.fully_shard

    @functools.wraps(shard)
    def recording_fully_shard(module: Any, *args: Any, **kwargs: Any) -> Any:
        for one in module if isinstance(module, (list, tuple)) else [module]:
            given_whole.extend((one, name, p.device.type) for name, p in one.named_parameters()
                               if not p.is_meta and not is_sharded(p))
        return shard(module, *args, **kwargs)

    TinyTransformer.__init__ = recording_init  # type: ignore[method-assign]
    torch.nn.Module.to_empty = recording_to_empty  # type: ignore[method-assign]
    torch.distributed.fsdp.fully_shard = recording_fully_shard
    try:
        model = build(mesh)
    except Exception as error:  # noqa: BLE001
        raise_if_unwritten(error)
        report["error"] = f"build_on_mesh(mesh) raised {one_line(error)}"
        return report
    finally:
        TinyTransformer.__init__ = make  # type: ignore[method-assign]
        torch.nn.Module.to_empty = materialize  # type: ignore[method-assign]
        torch.distributed.fsdp.fully_shard = shard
    report["built whole on"] = sorted({d for devices in built for d in devices if d != "meta"})
    report["materialized whole"] = whole
    if isinstance(model, torch.nn.Module):
        where = {id(module): name for name, module in model.named_modules()}
        report["sharded whole"] = {
            ".".join(filter(None, (where.get(id(module), type(module).__name__), name))): device
            for module, name, device in given_whole
        }
    if not isinstance(model, torch.nn.Module):
        report["error"] = f"build_on_mesh(mesh) returned a {type(model).__name__}, not the model"
        return report
    parameters = list(model.named_parameters())
    report["devices"] = sorted({p.device.type for _, p in parameters})
    report["groups"] = fsdp_groups(model)
    report["placements"] = _placements(model)
    report["param bytes"] = memory.param_bytes(model)
    report["full bytes"] = memory.count_params(TinyTransformer(**HSDP_MODEL, device="meta")) * 4
    # the second, different mesh: an answer that makes its own mesh shards the same way on both
    try:
        other = build(flat)
        report["flat placements"] = _placements(other)
        report["flat on the given mesh"] = all(
            not is_sharded(p) or p.device_mesh == flat for p in other.parameters()
        )
        report["flat param bytes"] = memory.param_bytes(other)
        del other
    except Exception as error:  # noqa: BLE001
        report["flat error"] = one_line(error)
    if report["devices"] != ["cpu"]:
        return report
    start = full_parameters(model)
    norms = [name for name, _ in parameters if ".norm" in name or name.startswith("norm.")]
    report["norms reset"] = all(
        torch.equal(start[n], torch.ones_like(start[n]) if n.endswith("weight") else torch.zeros_like(start[n]))
        for n in norms
    )
    report["finite"] = all(bool(torch.isfinite(t).all()) for t in start.values())
    report["uninitialized"] = sorted(
        n for n, t in start.items()
        if not bool(torch.isfinite(t).all()) or (t.dim() == 2 and not 1e-3 < t.float().std().item() < 10)
    )
    report["same start"] = same_start(start)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {n: t[:2].clone() for n, t in start.items()})
    report["replicas agree at start"] = all(
        torch.equal(other[n], gathered[0][n]) for other in gathered for n in gathered[0]
    )
    if not (report["norms reset"] and report["finite"]) or report["uninitialized"]:
        return report
    # the reference: one process, from the same initial weights, on the whole batch
    torch.manual_seed(0)
    reference = TinyTransformer(**HSDP_MODEL)
    reference.load_state_dict(start)
    tokens = counting_tokens(8, HSDP_MODEL["max_seq_len"], HSDP_MODEL["vocab_size"])
    mine = tokens.chunk(dist.get_world_size())[rank]
    try:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
        reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.5)
        losses, want = [], []
        for _ in range(_HSDP_STEPS):
            loss = next_token_loss(model(mine), mine)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            loss = loss.detach()
            dist.all_reduce(loss, op=dist.ReduceOp.AVG)
            losses.append(loss.item())
            reference_loss = next_token_loss(reference(tokens), tokens)
            reference_loss.backward()
            reference_optimizer.step()
            reference_optimizer.zero_grad()
            want.append(reference_loss.item())
    except Exception as error:  # noqa: BLE001
        report["error"] = f"training the model raised {one_line(error)}"
        return report
    report["losses"], report["want"] = losses, want
    end = full_parameters(model)
    report["weights differ"] = max((end[n] - p.detach()).abs().max().item() for n, p in reference.named_parameters())
    return report


@exercise
def check_build_on_mesh(build_on_mesh: Callable[[Any], Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """`build_on_mesh(mesh)` (a fill-in): a ``TinyTransformer(**HSDP_MODEL)`` built on meta, sharded with
    ``fully_shard(..., mesh=mesh)`` block by block then the root, materialized on the CPU and initialized.

    The check runs it on 4 ranks (gloo) with a 2 x 2 HSDP mesh (replicas across the hosts ranks 0-1 and
    2-3, shards within each) and reads the placements, the groups, the bytes each rank holds and the initial
    weights, then trains 3 SGD steps and compares them with one process on the whole batch, started from the
    same weights. It also calls it with a second, 1-D mesh of the 4 ranks: the parameters must be sharded
    over that mesh (an answer that makes its own mesh ignores its argument). While the first build runs, it
    records the devices of each TinyTransformer made, what ``to_empty`` allocates, and any allocated (not meta,
    not yet sharded) parameter given to ``torch.distributed.fsdp.fully_shard``: the model must reach the mesh
    on meta.
    """
    if launch is None:
        from course_lib import launch
    from course_lib.launcher.launch import LaunchError

    try:
        with warnings.catch_warnings():  # 4 ranks on fewer cores: fine for a check
            warnings.simplefilter("ignore", UserWarning)
            report = launch(  # a CPU exercise: gloo, whatever backend the course runs on
                _build_on_rank, build_on_mesh, world_size=4, backend="gloo", show_ranks=[], timeout=2 * _TIMEOUT_S
            )[0]
    except LaunchError as error:
        raised = [f for f in error.failures if f.kind == "raised"]
        if raised and all(f.exc_type == "NotImplementedError" and not f.message.strip() for f in raised):
            raise
        first = error.failures[0].headline() if error.failures else error.summary
        fail(f"the check's run on 4 ranks failed: {first}", "run build_on_mesh(mesh) in a launch of 4 ranks yourself "
             "to read the traceback")
    if "error" in report and "devices" not in report:
        fail(report["error"], "build the model on meta, fully_shard(block, mesh=mesh) each block, then the root")
    if report["devices"] != ["cpu"]:
        fail(
            f"the model's parameters are on {report['devices']}: it was never materialized",
            "after sharding, model.to_empty(device='cpu') allocates each rank's shards (then initialize them)",
        )
    if report["placements"] != ["(Replicate(), Shard(dim=0))"]:
        fail(
            f"given a 2 x 2 HSDP mesh, the parameters are placed {', '.join(report['placements'])}; sharded on that "
            "mesh they are placed (Replicate(), Shard(dim=0))",
            "pass the mesh you are given to fully_shard(..., mesh=mesh), for every block and the root",
        )
    blocks = [f"layers.{i}" for i in range(HSDP_MODEL["n_layers"])]
    if sorted(report["groups"]) != sorted(["", *blocks]):
        fail(
            f"the FSDP groups are {report['groups']}; expected one per block and the root",
            "fully_shard(block, mesh=mesh) for each block of model.layers, then fully_shard(model, mesh=mesh)",
        )
    if "flat error" in report:
        fail(f"given a 1-D mesh of the 4 ranks, build_on_mesh raised {report['flat error']}",
             "build on whatever mesh you are given: fully_shard(..., mesh=mesh) takes a 1-D or a 2-D mesh")
    if not report["flat on the given mesh"] or report["flat placements"] != ["(Shard(dim=0),)"]:
        fail(
            f"build_on_mesh ignored its mesh argument: given a 1-D mesh of the 4 ranks, its parameters are placed "
            f"{', '.join(report['flat placements'])} and each rank holds {report['flat param bytes']:,} parameter "
            f"bytes, not {report['full bytes'] // 4:,} (a quarter)",
            "shard on the `mesh` argument (fully_shard(..., mesh=mesh)); do not make a mesh inside build_on_mesh",
        )
    if report.get("built whole on"):
        fail(
            f"build_on_mesh built the TinyTransformer on {', '.join(report['built whole on'])}: every rank allocated "
            "the whole model before sharding it (fine here, impossible for a model that does not fit one rank)",
            "TinyTransformer(**lab06.HSDP_MODEL, device='meta'), fully_shard block by block and the root, then "
            "model.to_empty(device='cpu') and reset_parameters()",
        )
    if report.get("materialized whole"):
        names = report["materialized whole"]
        fail(
            f"build_on_mesh called to_empty before fully_shard: {len(names)} parameters ({', '.join(names[:2])}, ...) "
            "were allocated whole on every rank, then cut",
            "fully_shard block by block and the root while the model is on meta; then model.to_empty(device='cpu') "
            "allocates only each rank's shards (and reset_parameters() fills them)",
        )
    if report.get("sharded whole"):
        names, devices = list(report["sharded whole"]), sorted(set(report["sharded whole"].values()))
        fail(
            f"build_on_mesh gave fully_shard a model already allocated on {', '.join(devices)}: {len(names)} "
            f"parameters ({', '.join(names[:2])}, ...) were whole on every rank before sharding, though no "
            "TinyTransformer was built here (a copy of a model built earlier?): fine here, impossible for a model "
            "that does not fit one rank",
            "build it inside build_on_mesh: TinyTransformer(**lab06.HSDP_MODEL, device='meta'), fully_shard block "
            "by block and the root, then model.to_empty(device='cpu') and reset_parameters()",
        )
    if report["uninitialized"]:
        names = report["uninitialized"]
        only_attention = all("in_proj" in name for name in names)
        fail(
            f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''} {'is' if len(names) == 1 else 'are'} not "
            "initialized (zeros, NaN or garbage: to_empty allocates memory and leaves whatever was in it)",
            "nn.MultiheadAttention has no reset_parameters(): call its _reset_parameters()"
            if only_attention
            else "after to_empty, call reset_parameters() on every module that has one (and _reset_parameters() "
            "on nn.MultiheadAttention)",
        )
    if not report["finite"] or not report["norms reset"]:
        fail(
            "the LayerNorm weights are not 1 (or some weight is not finite): the model was not initialized",
            "after to_empty, call reset_parameters() on every module that has one",
        )
    if report.get("same start"):
        first, second = report["same start"]
        fail(
            f"{first} and {second} start with the same weights: every layer of a shape was given the same draw, so "
            "the blocks start as copies of each other (a loss compared from the same start does not show it)",
            "seed once, before the whole model is initialized, not before each module's reset_parameters(): each "
            "module must draw on from where the last one left the random generator",
        )
    if not report["replicas agree at start"]:
        fail(
            "the ranks start from different weights: the replicas are not replicas",
            "initialize the same way on every rank (the same seed): DTensor's RNG then gives each shard its part",
        )
    if "error" in report:
        fail(report["error"])
    for step, (got, want) in enumerate(zip(report["losses"], report["want"])):
        if abs(got - want) > 1e-4:
            fail(
                f"step {step + 1}: the mean loss over the 4 ranks is {got:.5f}, one process on the whole batch from the "
                f"same weights gets {want:.5f}",
                "the replicas must average their gradients: shard every group over the whole 2-D mesh",
            )
    if report["weights differ"] > 1e-4:
        fail(
            f"after {_HSDP_STEPS} steps the weights differ from one process's by {report['weights differ']:.2g}",
            "every block and the root on the same 2-D mesh: then HSDP is the same math as one process",
        )
    passed(
        f"built on meta on the mesh it was given: on 2 hosts x 2 each rank holds {report['param bytes']:,} of "
        f"{report['full bytes']:,} parameter bytes and {_HSDP_STEPS} losses equal one process's; on a 1-D mesh "
        f"of 4, {report['flat param bytes']:,}"
    )
