"""Lab 12's checks pass the solutions and reject the mistakes a learner plausibly makes, each with its reason."""
from __future__ import annotations

import sys

import cloudpickle
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from course_lib import parallel2d
from course_lib.checks import lab12

from conftest import rejects

cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------------ exercise 1


def col():
    from torch.distributed.tensor.parallel import ColwiseParallel

    return ColwiseParallel()


def row():
    from torch.distributed.tensor.parallel import RowwiseParallel

    return RowwiseParallel()


def good_plan(block):  # the writers of each sub-layer's result row-wise, every other Linear column-wise
    return {name: row() if name in ("attention.wo", "feed_forward.w2") else col()
            for name, module in block.named_modules() if isinstance(module, nn.Linear)}


def test_block_plan_passes_the_solution(capsys):
    lab12.check_block_plan(good_plan)
    assert capsys.readouterr().out.startswith("✓ tensor-parallel plans")


def test_block_plan_passes_wildcards():  # parallelize_module matches each dotted part with fnmatch
    def wildcards(block):
        gate = {"feed_forward.w[13]": col()} if hasattr(block.feed_forward, "w3") else {"feed_forward.w1": col()}
        return {"attention.w[qkv]": col(), "attention.wo": row(), **gate, "feed_forward.w2": row()}

    lab12.check_block_plan(wildcards)


def tower_block_plan(block):  # the lab's block typed in, whatever block it is handed
    return {"attention.wq": col(), "attention.wk": col(), "attention.wv": col(), "attention.wo": row(),
            "feed_forward.w1": col(), "feed_forward.w2": row()}


def mlp_only(block):  # attention left whole on every tp rank
    return {"feed_forward.w1": col(), "feed_forward.w2": row()}


def attention_only(block):
    return {"attention.wq": col(), "attention.wk": col(), "attention.wv": col(), "attention.wo": row()}


def swapped_mlp(block):  # row-wise first: it takes a whole input as if it were split
    return {**attention_only(block), "feed_forward.w1": row(), "feed_forward.w2": col()}


def without_wo(block):  # q, k, v split, but the output projection left whole
    return {"attention.wq": col(), "attention.wk": col(), "attention.wv": col(), "feed_forward.w1": col(),
            "feed_forward.w2": row()}


def all_colwise(block):
    return {name: col() for name in good_plan(block)}


def last_registered_rowwise(block):  # "the last Linear of each sub-layer writes its result": true of TowerBlock only
    plan = {}
    for part in ("attention", "feed_forward"):
        linears = [n for n, m in getattr(block, part).named_children() if isinstance(m, nn.Linear)]
        plan.update({f"{part}.{n}": row() if n == linears[-1] else col() for n in linears})
    return plan


def gate_rowwise(block):  # the gate taken for the feed-forward's second half
    return {**good_plan(block), "feed_forward.w3": row()} if hasattr(block.feed_forward, "w3") else good_plan(block)


def gate_rowwise_replicated(block):  # a row-wise gate that takes the whole input: its own all-reduce
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel

    return ({**good_plan(block), "feed_forward.w3": RowwiseParallel(input_layouts=Replicate())}
            if hasattr(block.feed_forward, "w3") else good_plan(block))


def two_all_reduces(block):  # every feed-forward Linear row-wise on a whole input: right math, an all-reduce each
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import RowwiseParallel

    return {**attention_only(block), **{name: RowwiseParallel(input_layouts=Replicate()) for name in good_plan(block)
                                        if name.startswith("feed_forward.")}}


def every_name_of_both(block):  # the gated block's plan handed to every block
    return {**tower_block_plan(block), "feed_forward.w3": col()}


def wrong_names(block):  # the names of torch's nn.TransformerEncoderLayer, not of this block
    return {"self_attn.out_proj": row(), "linear1": col(), "linear2": row()}


def tower_names(block):  # the names inside the Tower, not inside the block
    return {f"layers.0.{name}": style for name, style in good_plan(block).items()}


def gathered_outputs(block):  # torchtitan's output-layer style on every layer: right weights, right math, activations gathered
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {**{n: ColwiseParallel(output_layouts=Replicate()) for n in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1")},
            **{n: RowwiseParallel(input_layouts=Replicate()) for n in ("attention.wo", "feed_forward.w2")}}


def sequence_parallel_outputs(block):
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import RowwiseParallel

    return {**good_plan(block), "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1))}


def gathered_feed_forward(block):  # only the feed-forward pair gathers its hidden units
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    return {**attention_only(block), "feed_forward.w1": ColwiseParallel(output_layouts=Replicate()),
            "feed_forward.w2": RowwiseParallel(input_layouts=Replicate())}


def no_argument():  # the lab's earlier exercise: a plan of the TowerBlock, taking nothing
    return tower_block_plan(None)


@pytest.mark.parametrize("plan, reason", [
    (tower_block_plan, "feed_forward.w3 is not split over tp in the gated block"),
    (last_registered_rowwise, "w3 is row-wise"),
    (gate_rowwise, "w3 is row-wise"),
    (gate_rowwise_replicated, "w3 is row-wise"),
    (two_all_reduces, "feed_forward.w1's weight in the lab's TowerBlock is split S(1)"),
    (every_name_of_both, "names ['feed_forward.w3'], which a TowerBlock does not have"),
    (mlp_only, "attention.wq is not split over tp"),
    (attention_only, "feed_forward.w1 is not split over tp"),
    (swapped_mlp, "failed"),
    (without_wo, "attention.wo is not split over tp"),
    (all_colwise, "failed"),
    (wrong_names, "which a TowerBlock does not have"),
    (tower_names, "which a TowerBlock does not have"),
    (gathered_outputs, "all-gathers activations over tp 8 times"),
    (lambda block: {**mlp_only(block), "attention.wq": row(), "attention.wk": row(), "attention.wv": row(),
                    "attention.wo": col()},
     "failed"),  # the attention pair swapped: q, k, v row-wise take a whole input as if split
    (sequence_parallel_outputs, "failed"),  # wo, w2 reduce-scatter over the sequence, but the norms expect it whole
    (gathered_feed_forward, "all-gathers activations over tp 2 times"),
    (no_argument, "block_plan takes the block"),
    (lambda block: {}, "a plan is a dict"),
    (lambda block: [("attention.wq", col())], "a plan is a dict"),
])
def test_block_plan_rejects(plan, reason):
    rejects(lab12.check_block_plan, plan, match=reason)


# ------------------------------------------------------------------------------------------ exercise 2


def good_bytes(model, dp, tp):
    linear = sum(m.weight.numel() * m.weight.element_size() for m in model.modules() if isinstance(m, nn.Linear))
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return linear // (dp * tp) + (total - linear) // dp


def test_bytes_per_rank_passes_the_solution(capsys):
    lab12.check_bytes_per_rank(good_bytes)
    assert capsys.readouterr().out.startswith("✓")


def one_element_size(model, dp, tp, size=None):
    size = size or next(model.parameters()).element_size()
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)) * size
    total = sum(p.numel() for p in model.parameters()) * size
    return linear // (dp * tp) + (total - linear) // dp


@pytest.mark.parametrize("right", [
    lambda m, dp, tp: good_bytes(m, dp, tp) * 1.0,  # float division, exact here
    lambda m, dp, tp: __import__("numpy").int64(good_bytes(m, dp, tp)),
    lambda m, dp, tp: int(torch.tensor(good_bytes(m, dp, tp))),
])
def test_bytes_per_rank_passes_other_numbers(right, capsys):
    lab12.check_bytes_per_rank(right)
    assert capsys.readouterr().out.startswith("✓")


def test_the_mixed_dtype_case_holds_two_element_sizes():
    model, dp, tp = lab12._bytes_cases()[-1]
    assert {p.element_size() for p in model.parameters()} == {2, 4}
    assert lab12.reference_bytes(model, dp, tp) == good_bytes(model, dp, tp) != one_element_size(model, dp, tp)


def _total(model):
    return sum(p.numel() * 4 for p in model.parameters())


def _linear(model):
    return sum(m.weight.numel() * 4 for m in model.modules() if isinstance(m, nn.Linear))


@pytest.mark.parametrize("answer, reason", [
    (lambda m, dp, tp: _total(m) // (dp * tp), "it splits the LayerNorms over tp as well as dp"),
    # the norms split tp ways on their own line: the same mistake, named the same way
    (lambda m, dp, tp: _linear(m) // (dp * tp) + (_total(m) - _linear(m)) // (dp * tp),
     "it splits the LayerNorms over tp as well as dp, as if TP split them like the Linear weights"),
    (lambda m, dp, tp: _linear(m) // (dp * tp), "leaves out the LayerNorms"),
    (lambda m, dp, tp: _total(m) // dp, "ignores tensor parallelism"),
    (lambda m, dp, tp: _linear(m) // tp + (_total(m) - _linear(m)), "ignores FSDP"),
    (lambda m, dp, tp: sum(p.numel() for p in m.parameters()) // (dp * tp), "expected"),  # values, not bytes
    (lambda m, dp, tp: 17024, "expected"),  # the lab's measured figure, typed in
    # fp32 assumed: 4 bytes per value, right for the lab's Tower, twice too much for a bf16 one
    (lambda m, dp, tp: _linear(m) // (dp * tp) + (_total(m) - _linear(m)) // dp,
     "it counts 4 bytes for every value, but this Tower holds bfloat16 (2 bytes per value)"),
    # one element size for the whole model, read off its first parameter: right for a Tower of one dtype, wrong for
    # bf16 Linear weights beside fp32 LayerNorms (the first parameter is a norm's: 4 bytes for every Linear value)
    (one_element_size, "it counts 4 bytes for every value, but this Tower holds bfloat16 (2 bytes per value) in its "
                       "Linear weights, float32 (4 bytes per value) in its LayerNorms"),
    # ... or off a Linear weight: the norms then at 2 bytes
    (lambda m, dp, tp: one_element_size(m, dp, tp, m.layers[0].attention.wq.weight.element_size()),
     "it counts 2 bytes for every value"),
    # the right number in a 0-d tensor: `tensor == int` is a tensor, which would pass an `if`
    (lambda m, dp, tp: torch.tensor(good_bytes(m, dp, tp)), "bytes_per_rank returned Tensor tensor("),
    (lambda m, dp, tp: str(good_bytes(m, dp, tp)), "return a number of bytes"),
])
def test_bytes_per_rank_rejects(answer, reason):
    rejects(lab12.check_bytes_per_rank, answer, match=reason)


def slices_the_callers_linears(model, dp, tp):
    """Counts a rank's share by cutting the caller's Linear weights tp ways in place: the right number, and the
    caller's model is left a tp-th of itself (the guard compares modules' parameters, not only tensors and lists)."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            module.weight = nn.Parameter(module.weight.detach()[: module.weight.shape[0] // tp].clone())
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    return total // dp


def casts_the_caller_to_fp32_after_counting(model, dp, tp):
    got = good_bytes(model, dp, tp)
    model.float()
    return got


@pytest.mark.parametrize("answer, reason", [
    (slices_the_callers_linears, "bytes_per_rank changed its argument 1 (a Tower) in place: its parameter "
                                 "layers.0.attention.wq.weight changed shape"),
    (casts_the_caller_to_fp32_after_counting, "was cast from torch.bfloat16 to torch.float32"),
])
def test_bytes_per_rank_that_changes_the_callers_model_is_rejected(answer, reason):
    message = rejects(lab12.check_bytes_per_rank, answer, match=reason)
    assert "do not cast, move or change them" in message


def test_choose_mesh_that_moves_the_callers_model_is_rejected():
    def moves_to_meta(world_size, ranks_per_host, model, budget_bytes):
        answer = good_mesh(world_size, ranks_per_host, model, budget_bytes)
        model.to("meta")  # "to free the memory": the caller's model loses its weights
        return answer

    rejects(lab12.check_choose_mesh, moves_to_meta, match="moved from cpu to meta")


@pytest.mark.filterwarnings("ignore:launch. 4 ranks on")
def test_the_bytes_formula_is_what_the_ranks_hold():
    from course_lib import launch

    for shape in ((2, 2), (1, 4)):
        out = launch(parallel2d.train_2d, good_plan(parallel2d.TowerBlock(32, 4, 64)), mesh_shape=shape, steps=1, world_size=4, show_ranks=[])
        model = parallel2d.Tower()
        assert {r["param_bytes"] for r in out} == {lab12.reference_bytes(model, *shape)}
        gathered = max((c.bytes_out for c in out[0]["forward_collectives"] if c.op == "all_gather"), default=0)
        assert out[0]["param_bytes"] + gathered == lab12.reference_peak(model, *shape)
        assert out[0]["loss_diff"] < 1e-6


# ------------------------------------------------------------------------------------------ exercise 3


def good_mesh(world, per_host, model, budget):
    return lab12.reference_mesh(world, per_host, model, budget)


def test_choose_mesh_passes_the_solution(capsys):
    lab12.check_choose_mesh(good_mesh)
    assert capsys.readouterr().out.startswith("✓")


def test_choose_mesh_passes_numpy_integers(capsys):
    import numpy as np

    def numpy_pair(world, per_host, model, budget):
        got = good_mesh(world, per_host, model, budget)
        return None if got is None else (np.int64(got[0]), np.int64(got[1]))

    lab12.check_choose_mesh(numpy_pair)
    assert capsys.readouterr().out.startswith("✓")


# The solution's choose_mesh as a notebook cell defines it: it reads the bytes_per_rank of the notebook's namespace
_CHOOSE_MESH_CELL = """
def choose_mesh(world_size, ranks_per_host, model, budget_bytes):
    heads = model.layers[0].attention.wq.out_features // model.layers[0].attention.head_dim
    block = model.layers[0]
    for tp in range(1, world_size + 1):
        if world_size % tp or heads % tp or ranks_per_host % tp:
            continue
        dp = world_size // tp
        linear = sum(m.weight.numel() * m.weight.element_size() for m in block.modules() if isinstance(m, nn.Linear))
        block_bytes = sum(p.numel() * p.element_size() for p in block.parameters())
        gathered = linear // tp + (block_bytes - linear) if dp > 1 else 0
        if bytes_per_rank(model, dp, tp) + gathered <= budget_bytes:
            return dp, tp
    return None
"""


def mesh_cell_with(bytes_per_rank):
    namespace = {"nn": nn, "bytes_per_rank": bytes_per_rank}
    exec(_CHOOSE_MESH_CELL, namespace)  # noqa: S102  (a cell's code, run as the notebook runs it)
    return namespace["choose_mesh"]


def test_choose_mesh_on_the_solutions_bytes_passes(capsys):
    lab12.check_choose_mesh(mesh_cell_with(good_bytes))
    assert capsys.readouterr().out.startswith("✓")


def test_choose_mesh_on_a_bytes_per_rank_exercise_2_refuses_is_rejected():
    # 4 bytes for every value: right for the fp32 towers exercise 3 asks about, so it chose every mesh right
    four_bytes_each = lambda model, dp, tp: one_element_size(model, dp, tp, size=4)  # noqa: E731
    for world, per_host, model, budget, _ in lab12._mesh_cases():
        assert mesh_cell_with(four_bytes_each)(world, per_host, model, budget) == good_mesh(world, per_host, model, budget)
    with pytest.raises(lab12.CheckFailed,
                       match=r"bytes_per_rank gave .* it counts 4 bytes for every value, but this Tower holds bfloat16 .*"
                             r"\(choose_mesh builds on it, and exercise 2's check refuses it\)"):
        lab12.check_choose_mesh(mesh_cell_with(four_bytes_each))


def _heads(model):
    return model.layers[0].attention.wq.out_features // model.layers[0].attention.head_dim


def largest_tp(world, per_host, model, budget):  # the most TP that fits: valid, but not the choice asked for
    for tp in range(world, 0, -1):
        if world % tp == 0 and _heads(model) % tp == 0 and tp <= per_host and lab12.reference_peak(model, world // tp, tp) <= budget:
            return world // tp, tp
    return None


def ignores_hosts(world, per_host, model, budget):
    for tp in range(1, world + 1):
        if world % tp == 0 and _heads(model) % tp == 0 and lab12.reference_peak(model, world // tp, tp) <= budget:
            return world // tp, tp
    return None


def at_most_a_host(world, per_host, model, budget):  # tp <= ranks_per_host: tp = 3 on hosts of 4 groups ranks 3, 4, 5
    for tp in range(1, world + 1):
        if world % tp == 0 and _heads(model) % tp == 0 and tp <= per_host and lab12.reference_peak(model, world // tp, tp) <= budget:
            return world // tp, tp
    return None


def ignores_world(world, per_host, model, budget):
    for tp in range(1, world + 1):
        if _heads(model) % tp == 0 and per_host % tp == 0 and lab12.reference_peak(model, world // tp, tp) <= budget:
            return world // tp, tp
    return None


def ignores_heads(world, per_host, model, budget):
    for tp in range(1, world + 1):
        if world % tp == 0 and tp <= per_host and lab12.reference_peak(model, world // tp, tp) <= budget:
            return world // tp, tp
    return None


def resident_only(world, per_host, model, budget):  # forgets the gathered block: pure FSDP always "fits"
    for tp in range(1, world + 1):
        if world % tp == 0 and _heads(model) % tp == 0 and tp <= per_host and lab12.reference_bytes(model, world // tp, tp) <= budget:
            return world // tp, tp
    return None


def peak_with(gathered):
    def choose(world, per_host, model, budget):
        block = model.layers[0]
        for tp in range(1, world + 1):
            if world % tp or _heads(model) % tp or tp > per_host:
                continue
            if lab12.reference_bytes(model, world // tp, tp) + gathered(block, world // tp, tp) <= budget:
                return world // tp, tp
        return None
    return choose


def _block_gathered(block, tp):
    return _linear(block) // tp + _total(block) - _linear(block)


def under_the_budget(world, per_host, model, budget):  # peak < budget: a budget the peak may reach is refused
    for tp in range(1, world + 1):
        if world % tp == 0 and _heads(model) % tp == 0 and tp <= per_host and lab12.reference_peak(model, world // tp, tp) < budget:
            return world // tp, tp
    return None


@pytest.mark.parametrize("answer, reason", [
    (peak_with(lambda block, dp, tp: _block_gathered(block, tp)), "with dp = 1 FSDP has nothing to gather"),  # gathers at dp 1
    (under_the_budget, "also fits with less tensor parallelism"),
    (peak_with(lambda block, dp, tp: _total(block) // tp if dp > 1 else 0),  # the gathered block's norms split tp ways
     "33,920 bytes per rank, over the budget\nhint: the block FSDP gathers keeps its LayerNorms whole on every tp rank"),
    (lambda w, h, m, b: next(((w // tp, tp) for tp in range(1, h) if w % tp == 0 and _heads(m) % tp == 0  # tp < ranks per host
                               and lab12.reference_peak(m, w // tp, tp) <= b), None), "tp may equal ranks_per_host"),
    (lambda w, h, m, b: None if good_mesh(w, h, m, b) is None else good_mesh(w, h, m, b)[::-1], "in that order"),  # (tp, dp)
])
def test_choose_mesh_rejects_new_mistakes(answer, reason):
    rejects(lab12.check_choose_mesh, answer, match=reason)


@pytest.mark.parametrize("answer, reason", [
    (largest_tp, "less tensor parallelism"),
    (ignores_hosts, "spans hosts"),
    (at_most_a_host, "(4, 3) for a model of 6 heads on 12 ranks in 3 hosts of 4, budget 60,000 bytes: tp=3 is no more than a host's 4 ranks, "
                     "but tp groups take consecutive ranks, so the group 3, 4, 5 spans two hosts"),
    (ignores_heads, "do not split over tp"),
    (resident_only, "over the budget"),
    (lambda w, h, m, b: (w, 1), "over the budget"),  # always pure FSDP
    (lambda w, h, m, b: (2, 2), "less tensor parallelism"),  # the lab's answer, typed in
    (lambda w, h, m, b: [w // 2, 2], "less tensor parallelism"),  # a list is read as a pair
    (lambda w, h, m, b: "2x2", "return a pair"),
    # tp tested against the heads and the host but not the world: tp = 8 on 12 ranks leaves dp = 12 // 8 = 1
    (ignores_world, "(1, 8) for a model of 8 heads on 12 ranks in hosts of 8, budget 36,000 bytes: dp x tp must use all 12 ranks"),
    # adversarial round 2: dp = world_size / tp, a float: (2.0, 2) == (2, 2), so the right mesh's value passed
    (lambda w, h, m, b: None if good_mesh(w, h, m, b) is None else (good_mesh(w, h, m, b)[0] * 1.0, good_mesh(w, h, m, b)[1]),
     "return a pair (dp, tp) of ints, or None\nhint: world_size / tp is a float (2.0)"),
    # ... and the heads counted as dim // 8: every other case's heads are 8 wide
    (lambda w, h, m, b: next(((w // tp, tp) for tp in range(1, w + 1) if w % tp == 0 and h % tp == 0
                              and (m.layers[0].attention.wq.out_features // 8) % tp == 0
                              and lab12.reference_peak(m, w // tp, tp) <= b), None),
     "(1, 8) for a model of 4 heads, 16 wide, on 8 ranks in one host, budget 40,000 bytes: 4 heads do not split over tp=8"),
])
def test_choose_mesh_rejects(answer, reason):
    rejects(lab12.check_choose_mesh, answer, match=reason)


# ------------------------------------------------------------------------------------------ exercise 4



def _cos(q, c):
    return F.normalize(q, dim=1) @ F.normalize(c, dim=1).T


def good_sampled(q, c, log_q, t):
    return F.cross_entropy(_cos(q, c) / t - log_q[None, :], torch.arange(len(q)))


def test_sampled_softmax_passes_the_solution(capsys):
    lab12.check_sampled_softmax(good_sampled)
    assert capsys.readouterr().out.startswith("✓ sampled_softmax")


@pytest.mark.parametrize("answer, reason", [
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) / t, torch.arange(len(q))), "leaves out the correction"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) / t + lq[None, :], torch.arange(len(q))), "adds log_q"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) / t - lq[:, None], torch.arange(len(q))), "per row"),
    (lambda q, c, lq, t: F.cross_entropy((_cos(q, c) - lq[None, :]) / t, torch.arange(len(q))), "divides the correction"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) - lq[None, :], torch.arange(len(q))), "ignores the temperature"),
    (lambda q, c, lq, t: F.cross_entropy(q @ c.T / t - lq[None, :], torch.arange(len(q))), "raw dot products"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c).T / t - lq[None, :], torch.arange(len(q))), "transposes"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) / t - lq.exp()[None, :], torch.arange(len(q))), "expected"),
    (lambda q, c, lq, t: good_sampled(q, c, lq, t).detach(), "no gradient"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) / t - lq[None, :] * (1 - torch.eye(len(q))), torch.arange(len(q))),
     "corrects the negatives only"),
    (lambda q, c, lq, t: F.cross_entropy(_cos(q, c) / t - lq[None, :], torch.arange(len(q)), reduction="none"), "scalar"),
    # the right value, the wrong gradients
    (lambda q, c, lq, t: good_sampled(q, c.detach(), lq, t), "no gradient reaches candidates"),
    (lambda q, c, lq, t: good_sampled(q.detach(), c, lq, t), "no gradient reaches query"),
    pytest.param(lambda q, c, lq, t: torch.tensor(float(good_sampled(q, c, lq, t)), requires_grad=True), "no gradient reaches",
                 marks=pytest.mark.filterwarnings("ignore:Converting a tensor with requires_grad")),
])
def test_sampled_softmax_rejects(answer, reason):
    rejects(lab12.check_sampled_softmax, answer, match=reason)


def test_sampled_softmax_that_shifts_the_callers_log_q_is_rejected():
    def shifting_in_place(q, c, log_q, t):  # the right loss, but the caller's log_q now holds log_q * t
        log_q.mul_(t)
        return F.cross_entropy((_cos(q, c) - log_q[None, :]) / t, torch.arange(len(q)))

    rejects(lab12.check_sampled_softmax, shifting_in_place, match="sampled_softmax changed its argument 3")
