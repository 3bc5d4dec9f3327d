"""Checks for 12_llm_era: a tensor-parallel plan, the bytes of a 2-D layout, and the choice of a mesh."""
from __future__ import annotations

import numbers
from typing import Any, Callable, Mapping

from torch import nn

from course_lib import parallel2d
from course_lib.checks import (
    CheckFailed,
    builds_on,
    checked_call,
    exercise,
    fail,
    is_number,
    judged_again,
    launch_quietly,
    one_line,
    passed,
    raise_if_unwritten,
    same_gradients,
)

# Where each Linear's weight must be split over the tp mesh dimension, per block the check hands block_plan:
# column-wise layers split their output features (weight dim 0), row-wise layers their input features (weight dim 1).
# The gated block is Llama's shape, which the lab does not show: w1 and w3 both read the block's input, and their
# outputs meet unit by unit, so both are column-wise; w2 writes the result back, row-wise.
_ATTENTION_TP = {"attention.wq": "S(0)", "attention.wk": "S(0)", "attention.wv": "S(0)", "attention.wo": "S(1)"}
_EXPECTED_TP = {
    parallel2d.TowerBlock: {**_ATTENTION_TP, "feed_forward.w1": "S(0)", "feed_forward.w2": "S(1)"},
    parallel2d.GatedBlock: {**_ATTENTION_TP, "feed_forward.w1": "S(0)", "feed_forward.w3": "S(0)", "feed_forward.w2": "S(1)"},
}
_BLOCKS = (  # (the block's class, how a message names it)
    (parallel2d.TowerBlock, "the lab's TowerBlock"),
    (parallel2d.GatedBlock, "the gated block (Llama's: w2(silu(w1(x)) * w3(x)))"),
)


def _matches(key: str, name: str) -> bool:
    """Whether a plan's `key` names the submodule `name`: parallelize_module matches each dotted part with fnmatch."""
    import fnmatch

    keys, names = key.split("."), name.split(".")
    return len(keys) == len(names) and all(fnmatch.fnmatch(n, k) for k, n in zip(keys, names))


def _style(plan: Mapping[str, Any], name: str) -> str:
    """"colwise", "rowwise", another style's class name, or "" for the submodule `name` under `plan`."""
    styles = [style for key, style in plan.items() if _matches(key, name)]
    if not styles:
        return ""
    kind = type(styles[-1]).__name__
    return {"ColwiseParallel": "colwise", "RowwiseParallel": "rowwise"}.get(kind, kind)


def _failed_hint(plan: Mapping[str, Any], block: type) -> str:
    """Why training with `plan` on `block` most likely failed, from the styles it gives the feed-forward."""
    styles = {name: _style(plan, name) for name in _EXPECTED_TP[block]}
    if block is parallel2d.GatedBlock and styles["feed_forward.w3"] == "rowwise":
        return ("w3 is row-wise: it takes the block's whole input as if it were split over tp, and its output is "
                "multiplied with w1's unit by unit, so the two must be split alike")
    if block is parallel2d.GatedBlock and styles["feed_forward.w2"] == "colwise":
        return ("w2 is column-wise, but it reads the split hidden units of w1 and w3: the layer that writes a "
                "sub-layer's result back takes a split input")
    return ("a column-wise layer's output is split over tp, so the layer after it must take a split input "
            "(row-wise); every attention and feed-forward needs its pair")


def _judge_plan(plan: Any, block: type, what: str, launch: Callable[..., list[Any]]) -> dict[str, Any]:
    """Fail unless `plan` (block_plan's answer for a fresh `block`) trains a 2-layer Tower of such blocks on the
    2 x 2 mesh as one process does, with every Linear split as _EXPECTED_TP says and no activation gathered over tp."""
    import functools

    if not isinstance(plan, Mapping) or not plan:
        fail(f"block_plan returned {plan!r} for {what}: a plan is a dict from a submodule's name to a ParallelStyle",
             'for example {"attention.wq": ColwiseParallel(), ...}')
    expected = _EXPECTED_TP[block]
    names = [name for name, _ in block(32, 4, 64).named_modules() if name]
    unknown = sorted(str(key) for key in plan if not any(_matches(str(key), name) for name in names))
    if unknown:
        fail(f"the plan for {what} names {unknown}, which a {block.__name__} does not have",
             f"its Linear layers are {', '.join(expected)}: read them from the block you are handed "
             "(block.named_modules())")
    for layer in expected:
        if not _style(plan, layer):
            fail(f"{layer} is not split over tp in {what}: every tensor-parallel rank holds all of it",
                 "every Linear of the block you are handed belongs in the plan")
    try:
        train = functools.partial(parallel2d.train_2d, block=block)
        report = launch_quietly(launch, train, dict(plan), world_size=4, timeout=180)[0]
    except Exception as error:
        first = str(error).strip().splitlines()
        detail = next((line.strip() for line in first if "raised" in line), first[0] if first else "")
        fail(f"training {what} with your plan failed: {detail}", _failed_hint(plan, block))
    if report["loss_diff"] > 1e-5 or report["param_diff"] > 1e-5:
        fail(f"with your plan the 2-D model of {what} drifts from the single-process one (loss {report['loss_diff']:.2e}, "
             f"weights {report['param_diff']:.2e} after 3 steps)", "a correct plan changes where the math runs, not the math")
    placements = report["placements"]
    for layer, want in expected.items():
        got = placements.get(f"layers.0.{layer}.weight", ())
        tp = got[1] if len(got) > 1 else None
        if tp is None:
            fail(f"{layer} is not split over tp in {what}: every tensor-parallel rank holds all of it ({got})",
                 "every Linear of the block you are handed belongs in the plan")
        if tp != want:
            kind = "column-wise (its output features, weight dim 0)" if want == "S(0)" else "row-wise (its input features, weight dim 1)"
            fail(f"{layer}'s weight in {what} is split {tp} over tp; it should be split {kind}",
                 "a Linear that reads the sub-layer's input is column-wise; the one that writes its result back is "
                 "row-wise, so each attention and each feed-forward costs one all-reduce")
    tp_group = (0, 1)  # rank 0's tensor-parallel group on train_2d's (dp, tp) = (2, 2) mesh
    gathers = [c for c in report["forward_collectives"] if c.op == "all_gather" and tuple(c.group_ranks) == tp_group]
    if gathers:
        fail(f"the weights of {what} are split right, but one forward all-gathers activations over tp {len(gathers)} times "
             f"({sum(c.bytes_out for c in gathers):,} bytes on rank 0): every tp rank then computes every head or hidden "
             "unit after the gather", "keep a column-wise layer's output split and let the row-wise layer take it split: "
             "ColwiseParallel() and RowwiseParallel() with their default layouts (no output_layouts=Replicate() or "
             "input_layouts=Replicate()), so each attention and each feed-forward costs one all-reduce")
    return report


@exercise
def check_block_plan(block_plan: Callable[[nn.Module], Mapping[str, Any]], launch: Callable[..., list[Any]] | None = None) -> None:
    """`block_plan(block)` returns the TP plan of the block it is handed. The check hands it a fresh TowerBlock,
    then a fresh GatedBlock (Llama's gated feed-forward, which the lab does not show); for each it trains a 2-layer
    Tower of such blocks on a 2 x 2 mesh (TP with the plan, FSDP2 over dp) beside a single-process copy, then reads
    every weight's placement and the forward's collectives."""
    if launch is None:
        from course_lib import launch
    reports = []
    for block, what in _BLOCKS:
        try:
            plan = checked_call("block_plan", block_plan, block(32, 4, 64))
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"block_plan raised {one_line(error)} for {what}",
                 "block_plan takes the block to plan: read its Linear layers from it" if isinstance(error, TypeError) else "")
        reports.append(_judge_plan(plan, block, what, launch))
    passed("tensor-parallel plans: q, k, v, w1 (and the gate w3) column-wise, wo, w2 row-wise; both 2 x 2 towers equal "
           "one process (loss " + ", ".join(f"{r['loss_diff']:.1e}" for r in reports) + "; weights "
           + ", ".join(f"{r['param_diff']:.1e}" for r in reports) + ")")


# ------------------------------------------------------------------------------------------ exercise 2


def reference_bytes(model: nn.Module, dp: int, tp: int) -> int:
    """Bytes of parameters per rank of ``model`` (a Tower) under TP over ``tp`` and FSDP2 over ``dp``:
    the Linear weights are split dp x tp ways, everything else (the LayerNorms, which TP replicates) dp ways."""
    linear = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return linear // (dp * tp) + (total - linear) // dp


def _bytes_cases() -> list[tuple[parallel2d.Tower, int, int]]:
    import torch

    return [
        (parallel2d.Tower(dim=32, n_heads=4, hidden=64, n_layers=2), 2, 2),
        (parallel2d.Tower(dim=48, n_heads=6, hidden=96, n_layers=3), 1, 4),
        (parallel2d.Tower(dim=64, n_heads=8, hidden=256, n_layers=1), 4, 2),
        (parallel2d.Tower(dim=32, n_heads=4, hidden=64, n_layers=4).to(torch.bfloat16), 8, 1),  # 2 bytes per value
        (_bf16_linears(parallel2d.Tower(dim=64, n_heads=8, hidden=128, n_layers=2)), 2, 4),  # 2 and 4 bytes per value
    ]


def _bf16_linears(model: nn.Module) -> nn.Module:
    """`model` with its Linear layers in bfloat16 and the rest (the LayerNorms) left in float32, as mixed-precision
    LLM training keeps them: the parameters of one model then have two element sizes."""
    import torch

    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.to(torch.bfloat16)
    return model


def _dtypes(model: nn.Module) -> str:
    """``"bfloat16 (2 bytes per value)"``, or for a mixed model each kind of layer's dtype."""
    def named(p: Any) -> str:
        return f"{str(p.dtype).removeprefix('torch.')} ({p.element_size()} byte{'s' if p.element_size() > 1 else ''} per value)"

    linear = {named(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    other = {named(p) for p in model.parameters()} - linear
    if not other or linear == other:
        return next(iter(linear))
    return f"{' and '.join(sorted(linear))} in its Linear weights, {' and '.join(sorted(other))} in its LayerNorms"


@exercise
def check_bytes_per_rank(bytes_per_rank: Callable[[nn.Module, int, int], Any]) -> None:
    """`bytes_per_rank(model, dp, tp)`: parameter bytes each rank holds under the 2-D layout."""
    judge_bytes_per_rank(bytes_per_rank)
    passed("bytes_per_rank: Linear weights split dp x tp ways, LayerNorms dp ways (5 layouts, 5 models: fp32, bf16 "
           "and bf16 Linears with fp32 LayerNorms)")


def judge_bytes_per_rank(bytes_per_rank: Callable[[nn.Module, int, int], Any]) -> None:
    """Exercise 2's judgement: fail unless `bytes_per_rank` gives the bytes of every case; exercise 3's check
    applies it again to the bytes_per_rank a choose_mesh calls."""
    for model, dp, tp in _bytes_cases():
        want = reference_bytes(model, dp, tp)
        try:
            got = checked_call("bytes_per_rank", bytes_per_rank, model, dp, tp)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"bytes_per_rank raised {one_line(error)} (dp={dp}, tp={tp})")
        if not is_number(got):
            fail(f"bytes_per_rank returned {type(got).__name__} {got!r} (dp={dp}, tp={tp})",
                 "return a number of bytes, an int: int(...) of a tensor's value, or sums of p.numel() * p.element_size()")
        if got == want:
            continue
        total = sum(p.numel() * p.element_size() for p in model.parameters())
        linear = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))
        case = f"dp={dp}, tp={tp}, a {len(model.layers)}-layer Tower of {total:,} bytes"
        if got in (total // (dp * tp), linear // (dp * tp) + (total - linear) // (dp * tp)):
            fail(f"bytes_per_rank gave {got:,} for {case}, expected {want:,}: it splits the LayerNorms over tp as well as dp, "
                 "as if TP split them like the Linear weights",
                 "TP splits only the Linear layers; the LayerNorms stay whole on every tp rank (FSDP still shards them over dp)")
        if got == linear // (dp * tp):
            fail(f"bytes_per_rank gave {got:,} for {case}, expected {want:,}: it leaves out the LayerNorms",
                 "count every parameter: the norms are split over dp only")
        if got == total // dp:
            fail(f"bytes_per_rank gave {got:,} for {case}, expected {want:,}: it ignores tensor parallelism")
        if got == total // tp or got == linear // tp + (total - linear):
            fail(f"bytes_per_rank gave {got:,} for {case}, expected {want:,}: it ignores FSDP over dp")
        values = sum(p.numel() for p in model.parameters())
        linear_values = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
        for size in sorted({4} | {p.element_size() for p in model.parameters()}, reverse=True):
            if got == linear_values * size // (dp * tp) + (values - linear_values) * size // dp:  # one size for all
                fail(f"bytes_per_rank gave {got:,} for {case}, expected {want:,}: it counts {size} bytes for every "
                     f"value, but this Tower holds {_dtypes(model)}",
                     "count each parameter's own bytes: p.numel() * p.element_size()")
        fail(f"bytes_per_rank gave {got!r} for {case}, expected {want:,}",
             "Linear weights / (dp * tp) + the other parameters / dp, in bytes (fp32: 4 per value)")


# ------------------------------------------------------------------------------------------ exercise 3


def reference_peak(model: nn.Module, dp: int, tp: int) -> int:
    """Parameter bytes at the peak of a forward: what the rank holds, plus the one block FSDP has gathered over
    dp (its Linear weights split tp ways, its LayerNorms whole); nothing is gathered when dp is 1."""
    block = model.layers[0]
    linear = sum(m.weight.numel() * m.weight.element_size() for m in block.modules() if isinstance(m, nn.Linear))
    total = sum(p.numel() * p.element_size() for p in block.parameters())
    gathered = linear // tp + (total - linear) if dp > 1 else 0
    return reference_bytes(model, dp, tp) + gathered


def reference_mesh(world_size: int, ranks_per_host: int, model: parallel2d.Tower, budget_bytes: int) -> tuple[int, int] | None:
    """The mesh the lab asks for: the smallest tp (the least tensor-parallel traffic) that divides the world and
    the heads and whose groups stay inside a host, and whose peak parameter bytes per rank (:func:`reference_peak`)
    fit the budget; None if none does. A ``(dp, tp)`` mesh puts consecutive ranks in a tp group and a host holds
    ``ranks_per_host`` consecutive ranks, so every tp group stays inside a host exactly when tp divides
    ``ranks_per_host`` (tp = 3 on hosts of 4 makes the group 3, 4, 5, across two hosts)."""
    n_heads = model.layers[0].attention.wq.out_features // model.layers[0].attention.head_dim
    for tp in range(1, world_size + 1):
        if world_size % tp or n_heads % tp or ranks_per_host % tp:
            continue
        if reference_peak(model, world_size // tp, tp) <= budget_bytes:
            return (world_size // tp, tp)
    return None


def _mesh_cases() -> list[tuple[int, int, parallel2d.Tower, int, str]]:
    small = parallel2d.Tower(dim=32, n_heads=4, hidden=64, n_layers=2)
    wide = parallel2d.Tower(dim=48, n_heads=6, hidden=192, n_layers=2)
    lab = "the lab's model of 4 heads on 4 ranks in 2 hosts of 2"  # each label names the model and the cluster
    return [
        (4, 2, small, 40_000, f"{lab}, budget 40,000 bytes"),
        # exactly pure FSDP's peak: a budget is a limit the peak may reach
        (4, 2, small, reference_peak(small, 4, 1), f"{lab}, budget {reference_peak(small, 4, 1):,} bytes"),
        # a byte under (2, 2)'s peak: nothing fits, unless the peak is underestimated
        (4, 2, small, reference_peak(small, 2, 2) - 1, f"{lab}, budget {reference_peak(small, 2, 2) - 1:,} bytes"),
        (8, 4, wide, 90_000, "a model of 6 heads on 8 ranks in 2 hosts of 4, budget 90,000 bytes"),
        (8, 4, wide, 60_000, "a model of 6 heads on 8 ranks in 2 hosts of 4, budget 60,000 bytes"),
        (6, 6, wide, 40_000, "a model of 6 heads on 6 ranks in one host, budget 40,000 bytes"),  # only tp = 6, dp = 1: nothing gathered
        # tp = 3 fits the budget and is at most a host, but its groups 3, 4, 5 and 6, 7, 8 span hosts: nothing fits
        (12, 4, wide, 60_000, "a model of 6 heads on 12 ranks in 3 hosts of 4, budget 60,000 bytes"),
        # tp = 8 divides a host and the heads, and fits, but not the 12 ranks (dp = 1.5): nothing fits
        (12, 8, parallel2d.Tower(dim=64, n_heads=8, hidden=128, n_layers=2), 36_000,
         "a model of 8 heads on 12 ranks in hosts of 8, budget 36,000 bytes"),
        # heads 16 wide (the others are 8): tp = 8 fits, but 4 heads do not split 8 ways; 1, 2 and 4 do not fit, so
        # nothing does (a head count read as dim // 8 would allow tp = 8)
        (8, 8, parallel2d.Tower(dim=64, n_heads=4, hidden=128, n_layers=2), 40_000,
         "a model of 4 heads, 16 wide, on 8 ranks in one host, budget 40,000 bytes"),
    ]


@exercise
def check_choose_mesh(choose_mesh: Callable[[int, int, nn.Module, int], Any]) -> None:
    """`choose_mesh(world_size, ranks_per_host, model, budget_bytes)` -> ``(dp, tp)`` or None. A choose_mesh that
    calls a bytes_per_rank is held to exercise 2's check on it first: the meshes here are all fp32, where a
    bytes_per_rank that counts 4 bytes for every value still agrees."""
    earlier = builds_on(choose_mesh, "bytes_per_rank")
    if earlier is not None:
        judged_again("exercise 2", judge_bytes_per_rank, earlier, by="choose_mesh")
    for world, per_host, model, budget, what in _mesh_cases():
        want = reference_mesh(world, per_host, model, budget)
        try:
            got = checked_call("choose_mesh", choose_mesh, world, per_host, model, budget)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"choose_mesh raised {one_line(error)} ({what})")
        got = tuple(got) if isinstance(got, (tuple, list)) else got
        if got is not None:  # checked before the value: (2.0, 2) == (2, 2), but a mesh of 2.0 ranks cannot be built
            pair = isinstance(got, tuple) and len(got) == 2
            if not (pair and all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in got)):
                floats = [v for v in got if isinstance(v, float)] if pair else []
                fail(f"choose_mesh returned {got!r} for {what}: return a pair (dp, tp) of ints, or None",
                     f"world_size / tp is a float ({floats[0]!r}) even when tp divides the world: use world_size // tp "
                     "(init_device_mesh takes whole numbers of ranks)" if floats else "")
            got = (int(got[0]), int(got[1]))  # a NumPy integer is an int too
        if got == want:
            continue
        if got is None:
            fail(f"choose_mesh returned None for {what}, but {want} fits (peak {reference_peak(model, *want):,} bytes)",
                 "with dp = 1 FSDP has nothing to gather: the peak is what the rank holds" if want[0] == 1 else
                 "a rank may reach the budget, not only stay under it" if reference_peak(model, *want) == budget else
                 ("tp may equal ranks_per_host (a tp group that fills a host stays inside it); and " if want[1] == per_host
                  else "") + "the peak is what a rank holds plus the one block FSDP gathers, its Linear weights split tp ways")
        if want is not None and got == (want[1], want[0]):
            fail(f"choose_mesh returned {got} for {what}; expected {want}: the pair is (dp, tp), in that order")
        dp, tp = got
        heads = model.layers[0].attention.wq.out_features // model.layers[0].attention.head_dim
        if dp * tp != world:
            fail(f"choose_mesh returned {got} for {what}: dp x tp must use all {world} ranks",
                 f"{world} ranks split into dp groups of tp only when tp divides the world size: test world_size % tp "
                 "as well as the heads and ranks_per_host")
        if heads % tp:
            fail(f"choose_mesh returned {got} for {what}: {heads} heads do not split over tp={tp}",
                 "each tensor-parallel rank computes whole heads")
        if tp > per_host:
            fail(f"choose_mesh returned {got} for {what}: tp={tp} spans hosts ({per_host} ranks per host)",
                 "TP all-reduces activations in every block, 2 times in the forward and 4 in the backward: keep it on the fast links inside a host")
        if per_host % tp:
            fail(f"choose_mesh returned {got} for {what}: tp={tp} is no more than a host's {per_host} ranks, but tp groups "
                 f"take consecutive ranks, so the group {', '.join(map(str, range(per_host - per_host % tp, per_host - per_host % tp + tp)))} "
                 "spans two hosts", "every tp group stays inside a host only when tp divides ranks_per_host")
        if reference_peak(model, dp, tp) > budget:
            block = model.layers[0]
            block_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
            norms_split = reference_bytes(model, dp, tp) + (block_bytes // tp if dp > 1 else 0) <= budget
            fail(f"choose_mesh returned {got} for {what}: its peak is {reference_peak(model, dp, tp):,} bytes per rank, "
                 "over the budget",
                 "the block FSDP gathers keeps its LayerNorms whole on every tp rank: only its Linear weights are split "
                 "tp ways" if norms_split and tp > 1 else
                 "the peak is what a rank holds plus the block FSDP gathers (section 3)")
        if want is None:
            fail(f"choose_mesh returned {got} for {what}; no mesh fits, so it should return None")
        fail(f"choose_mesh returned {got} for {what}; {want} also fits with less tensor parallelism",
             "prefer the smallest tp that fits: more data parallelism, fewer per-layer all-reduces")
    passed(f"choose_mesh: the smallest tp that divides the world and the heads, stays in a host and fits ({len(_mesh_cases())} cases)")


# ------------------------------------------------------------------------------------------ exercise 4


def _sampled_softmax_mistakes(q: Any, c: Any, log_q: Any, t: float) -> dict[str, Any]:
    import torch
    from torch.nn import functional as F

    sim = F.normalize(q, dim=1) @ F.normalize(c, dim=1).T
    labels = torch.arange(len(q))
    return {
        "leaves out the correction (or subtracts it per row, which a softmax ignores): log_q must be subtracted "
        "from each candidate's logit, one per column": F.cross_entropy(sim / t, labels),
        "adds log_q: a popular candidate must lose logit, not gain it": F.cross_entropy(sim / t + log_q[None, :], labels),
        "divides the correction by the temperature: subtract log_q from the final logits":
            F.cross_entropy((sim - log_q[None, :]) / t, labels),
        "ignores the temperature": F.cross_entropy(sim - log_q[None, :], labels),
        "uses raw dot products: compare cosine similarities (normalize both sides)":
            F.cross_entropy(q @ c.T / t - log_q[None, :], labels),
        "transposes the similarity matrix: each query row chooses among the candidates":
            F.cross_entropy(sim.T / t - log_q[None, :], labels),
        "corrects the negatives only: subtract log_q from every candidate's logit, the row's own positive too":
            F.cross_entropy(sim / t - log_q[None, :] * (1 - torch.eye(len(q))), labels),
    }


@exercise
def check_sampled_softmax(sampled_softmax: Callable[..., Any]) -> None:
    """`sampled_softmax(query, candidates, log_q, temperature)`: in-batch softmax with the logQ correction."""
    import math

    import torch

    from course_lib.genrec import reference_sampled_softmax

    g = torch.Generator().manual_seed(21)
    cases = [(torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g), 0.1),
             (torch.randn(10, 8, generator=g) * 2, torch.randn(10, 8, generator=g), 0.25)]
    for q, c, t in cases:
        log_q = torch.log(torch.softmax(torch.randn(len(q), generator=g) * 2, 0))
        qi, ci = q.clone().requires_grad_(), c.clone().requires_grad_()
        try:
            got = checked_call("sampled_softmax", sampled_softmax, qi, ci, log_q.clone(), t)
        except CheckFailed:
            raise
        except Exception as error:
            raise_if_unwritten(error)
            fail(f"sampled_softmax raised {one_line(error)} on a batch of {len(q)}")
        if not isinstance(got, torch.Tensor) or got.numel() != 1:
            fail(f"sampled_softmax returned {type(got).__name__} {tuple(getattr(got, 'shape', ()))}: return the loss, a "
                 "scalar tensor", "cross-entropy averaged over the rows")
        if not got.requires_grad:
            fail("sampled_softmax returned a tensor with no gradient: it was detached from query and candidates")
        want = float(reference_sampled_softmax(q, c, log_q, t))
        value = float(got.detach())
        if not math.isclose(value, want, rel_tol=1e-5, abs_tol=1e-6):
            for mistake, wrong in _sampled_softmax_mistakes(q, c, log_q, t).items():
                if math.isclose(value, float(wrong), rel_tol=1e-5, abs_tol=1e-6):
                    fail(f"sampled_softmax gave {value:.4f}, expected {want:.4f}: it {mistake}")
            fail(f"sampled_softmax gave {value:.4f} on a batch of {len(q)} at temperature {t}, expected {want:.4f}",
                 "cosine similarities / temperature, minus log_q per column, cross-entropy against each row's own index")
        same_gradients("sampled_softmax", got, {"query": qi, "candidates": ci}, reference_sampled_softmax, (q, c, log_q, t),
                       "the loss trains both towers: the query encoder and the candidates' item embeddings")
    passed("sampled_softmax: cosine / temperature - log q per candidate, each query against its own target (2 fresh batches)")
