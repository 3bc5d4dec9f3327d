"""The 07_hybrid checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import math

import pytest
from torchrec.distributed.model_parallel import DataParallelWrapper

from course_lib.checks import CheckFailed, lab07

# ------------------------------------------------------------------------------------------ exercise 1
# Wrappers shipped to the ranks import what they use, so cloudpickle sends them by value.


class ShardDenseWithFSDP(DataParallelWrapper):  # the lab's solution
    def wrap(self, dmp, env, device):
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        dense = (dlrm.dense_arch, dlrm.over_arch)
        with torch.no_grad():
            for module in dense:
                for tensor in [*module.parameters(), *module.buffers()]:
                    dist.broadcast(tensor.data, src=0)
        for module in dense:
            fully_shard(module)


class SyncModuleStates(DataParallelWrapper):  # torch's own helper, the one DDP's constructor calls
    def wrap(self, dmp, env, device):
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.utils import _sync_module_states

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            _sync_module_states(module, env.process_group, 250 * 1024 * 1024, src=0, params_and_buffers_to_ignore=())
            fully_shard(module)


class BroadcastOneFlatTensor(DataParallelWrapper):  # one broadcast; every buffer of the model, triu_indices too
    def wrap(self, dmp, env, device):
        import torch
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        dense = (dlrm.dense_arch, dlrm.over_arch)
        tensors = [p.data for m in dense for p in m.parameters()] + [b.data for b in dlrm.buffers()]
        flat = _flatten_dense_tensors([t.double() for t in tensors])
        dist.broadcast(flat, src=0)
        with torch.no_grad():
            for tensor, value in zip(tensors, _unflatten_dense_tensors(flat, tensors)):
                tensor.copy_(value)
        for module in dense:
            fully_shard(module)


class BroadcastTheParametersOnly(DataParallelWrapper):  # the BatchNorm's running statistics stay each rank's own
    def wrap(self, dmp, env, device):
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        dense = (dlrm.dense_arch, dlrm.over_arch)
        with torch.no_grad():
            for module in dense:
                for p in module.parameters():
                    dist.broadcast(p.data, src=0)
        for module in dense:
            fully_shard(module)


class BroadcastTheFloatBuffersOnly(DataParallelWrapper):  # num_batches_tracked (int64) left out
    def wrap(self, dmp, env, device):
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        dense = (dlrm.dense_arch, dlrm.over_arch)
        with torch.no_grad():
            for module in dense:
                for tensor in [*module.parameters(), *module.buffers()]:
                    if tensor.is_floating_point():
                        dist.broadcast(tensor.data, src=0)
        for module in dense:
            fully_shard(module)


class BuffersFromRank1(DataParallelWrapper):  # the parameters from rank 0, the buffers from rank 1
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for p in module.parameters():
                dist.broadcast(p.data, src=0)
            for b in module.buffers():
                dist.broadcast(b.data, src=1)
            fully_shard(module)


class ResetTheRunningStats(DataParallelWrapper):  # equal on every rank, but not rank 0's buffers
    def wrap(self, dmp, env, device):
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for p in module.parameters():
                dist.broadcast(p.data, src=0)
            for m in module.modules():
                if isinstance(m, torch.nn.BatchNorm1d):
                    m.reset_running_stats()
            fully_shard(module)


class ShardWithoutBroadcast(DataParallelWrapper):  # the lab's old solution: each rank keeps its own rows
    def wrap(self, dmp, env, device):
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            fully_shard(module)


class BroadcastDenseArchOnly(DataParallelWrapper):  # one dense module synchronised, the other not
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for p in dlrm.dense_arch.parameters():
            dist.broadcast(p.data, src=0)
        for module in (dlrm.dense_arch, dlrm.over_arch):
            fully_shard(module)


class BroadcastTheWeightsOnly(DataParallelWrapper):  # the biases keep each rank's own values
    def wrap(self, dmp, env, device):
        import torch
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        dense = (dlrm.dense_arch, dlrm.over_arch)
        with torch.no_grad():
            for module in dense:
                for name, p in module.named_parameters():
                    if name.endswith("weight"):
                        dist.broadcast(p.data, src=0)
        for module in dense:
            fully_shard(module)


class BroadcastFromRank1(DataParallelWrapper):
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=1)
            fully_shard(module)


class AverageTheWeights(DataParallelWrapper):  # all_reduce where a broadcast belongs
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for p in module.parameters():
                dist.all_reduce(p.data)
                p.data /= dist.get_world_size()
            fully_shard(module)


class ReseedAndReinitialise(DataParallelWrapper):  # equal on every rank, but not the model DDP would train
    def wrap(self, dmp, env, device):
        import torch
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        torch.manual_seed(0)
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for m in module.modules():
                if isinstance(m, torch.nn.Linear):
                    m.reset_parameters()
            fully_shard(module)


class BroadcastAfterShard(DataParallelWrapper):  # too late: each rank holds only its rows by then
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            fully_shard(module)
            for p in module.parameters():
                dist.broadcast(p.to_local(), src=0)
            for b in module.buffers():
                dist.broadcast(b.data, src=0)


class BroadcastTheWholeModel(DataParallelWrapper):  # the tables too: each rank holds other shards
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for p in dmp._dmp_wrapped_module.parameters():
            dist.broadcast(p.data, src=0)
        for module in (dlrm.dense_arch, dlrm.over_arch):
            fully_shard(module)


class WrapNothing(DataParallelWrapper):
    def wrap(self, dmp, env, device):
        pass


class WrapInDDP(DataParallelWrapper):  # what DMP does by default
    def wrap(self, dmp, env, device):
        from torchrec.distributed.model_parallel import DefaultDataParallelWrapper

        DefaultDataParallelWrapper().wrap(dmp, env, device)


class ShardWholeModel(DataParallelWrapper):  # broadcast right, then fully_shard reaches the tables
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        fully_shard(dmp._dmp_wrapped_module)


class ShardTheSparseArchToo(DataParallelWrapper):  # every module of the DLRM, the tables' one included
    def wrap(self, dmp, env, device):
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dlrm = dmp._dmp_wrapped_module.model
        for module in (dlrm.dense_arch, dlrm.over_arch):
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=0)
        for module in (dlrm.sparse_arch, dlrm.dense_arch, dlrm.over_arch):
            fully_shard(module)


class ShardDenseArchOnly(DataParallelWrapper):
    def wrap(self, dmp, env, device):
        from torch.distributed.fsdp import fully_shard

        fully_shard(dmp._dmp_wrapped_module.model.dense_arch)


class ShardPerceptronsOnly(DataParallelWrapper):  # blocks without the modules around them
    def wrap(self, dmp, env, device):
        from torch.distributed.fsdp import fully_shard
        from torchrec.modules.mlp import Perceptron

        for module in list(dmp._dmp_wrapped_module.modules()):
            if isinstance(module, Perceptron):
                fully_shard(module)


class NotWritten(DataParallelWrapper):
    def wrap(self, dmp, env, device):
        raise NotImplementedError()


def test_wrapper_check_accepts_the_solution_and_the_library_wrapper(capsys):
    from course_lib.hybrid import FullyShardDense

    lab07.check_wrapper(ShardDenseWithFSDP)
    lab07.check_wrapper(FullyShardDense())
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("✓") for line in out)
    assert ("10 dense parameters are Shard(0) DTensors holding rank 0's initial weights on every rank, and the 3 "
            "BatchNorm buffers are rank 0's") in out[0]
    assert "reduce_scatter" in out[0]


def test_wrapper_check_accepts_other_ways_to_broadcast(capsys):
    lab07.check_wrapper(SyncModuleStates)
    lab07.check_wrapper(BroadcastOneFlatTensor)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 2 and all(line.startswith("✓") for line in out)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (WrapNothing, "plain tensors and nothing synchronises them"),
        (WrapInDDP, "wrapped in DDP"),
        (ShardWholeModel, "embedding tables became DTensors"),
        (ShardDenseArchOnly, "over_arch.* still plain tensors"),
        (ShardPerceptronsOnly, r"over_arch\.model\.1\.weight.* still plain"),
        (NotWritten, "not written yet"),
        (object, "expected a DataParallelWrapper"),
        (ShardWithoutBroadcast, "patchwork"),
        (BroadcastDenseArchOnly, "patchwork .*over_arch"),
        (BroadcastTheWeightsOnly, "patchwork of rank 0's and rank 1's rows in every bias"),
        (BroadcastFromRank1, "rank 1's dense weights"),
        (AverageTheWeights, "mean of the ranks' initial weights"),
        (ReseedAndReinitialise, "not rank 0's initial weights"),
        (BroadcastAfterShard, "before fully_shard"),
        (BroadcastTheWholeModel, "only the dense modules|tables"),
        (BroadcastTheParametersOnly, r"rank 1 still holds its own BatchNorm buffers after wrap\(\), not rank 0's "
                                     r"\(num_batches_tracked, running_mean, running_var of dense_arch.model.0\): the "
                                     r"broadcast sent the parameters only"),
        (BroadcastTheFloatBuffersOnly, r"rank 1 still holds its own num_batches_tracked of dense_arch.model.0 "
                                       r"after wrap\(\) \(its other BatchNorm buffers are rank 0's\)"),
        (BuffersFromRank1, "every rank holds rank 1's BatchNorm buffers"),
        (ResetTheRunningStats, r"equal on every rank but are not rank 0's \(num_batches_tracked, running_mean, "
                               r"running_var of dense_arch.model.0\)"),
        (ShardTheSparseArchToo, "embedding tables became DTensors"),
    ],
)
def test_wrapper_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab07.check_wrapper(wrong)


def test_a_partial_patchwork_hint_names_an_async_broadcast_not_waited_for():
    # dist.broadcast(p.data, src=0, async_op=True) for every parameter, and no wait(): the learner did broadcast
    # the weights, but fully_shard came before some of them arrived (here the weights', not the biases'). Whether
    # they arrive in time depends on the run, so the verdict is tested on the reports such a run gives.
    import torch

    names = ["model.dense_arch.0.weight", "model.dense_arch.0.bias"]
    before = [{n: torch.full((4, 3) if n.endswith("weight") else (4,), float(rank)) for n in names} for rank in (0, 1)]
    start = {names[0]: torch.cat([before[0][names[0]][:2], before[1][names[0]][2:]]), names[1]: before[0][names[1]]}
    reports = [{"before": before[rank], "start": start} for rank in (0, 1)]
    with pytest.raises(CheckFailed, match=r"patchwork of rank 0's and rank 1's rows in every weight .*not yet: a "
                                          r"broadcast with async_op=True that nobody waited for") as failure:
        lab07._judge_start(reports)
    assert "with async_op=True, wait() on each Work before fully_shard" in failure.value.hint


# ------------------------------------------------------------------------------------------ exercise 2


def fsdp_dense_bytes(shapes, world_size, rank):  # the lab's solution
    total = 0
    for shape in shapes.values():
        rows = shape[0]
        per_rank = math.ceil(rows / world_size)  # torch.chunk: ceil-sized chunks, the last ones shorter or none
        mine = max(0, min(per_rank, rows - rank * per_rank))
        total += 16 * mine * math.prod(shape[1:])  # fp32 param + grad + Adam's exp_avg and exp_avg_sq
    return total


def ddp_bytes(shapes, world_size, rank):
    return 16 * sum(math.prod(s) for s in shapes.values())


def even_split(shapes, world_size, rank):
    return 16 * sum(math.prod(s) for s in shapes.values()) / world_size


def ceil_rows_everywhere(shapes, world_size, rank):
    return sum(16 * math.ceil(s[0] / world_size) * math.prod(s[1:]) for s in shapes.values())


def params_only(shapes, world_size, rank):
    return fsdp_dense_bytes(shapes, world_size, rank) // 4


def floor_rows(shapes, world_size, rank):  # rows // ranks on every rank: the remainder rows belong to no one
    return sum(16 * (s[0] // world_size) * math.prod(s[1:]) for s in shapes.values())


def last_rank_gets_the_rest(shapes, world_size, rank):  # np.array_split order reversed: short chunks first
    total = 0
    for shape in shapes.values():
        rows = shape[0]
        per_rank = math.ceil(rows / world_size)
        mine = max(0, min(per_rank, rows - (world_size - 1 - rank) * per_rank))
        total += 16 * mine * math.prod(shape[1:])
    return total


def cut_the_last_dim(shapes, world_size, rank):  # Shard(-1) instead of Shard(0)
    total = 0
    for shape in shapes.values():
        cols = shape[-1]
        per_rank = math.ceil(cols / world_size)
        mine = max(0, min(per_rank, cols - rank * per_rank))
        total += 16 * mine * math.prod(shape[:-1])
    return total


def remainder_to_the_first_ranks(shapes, world_size, rank):  # numpy.array_split, not torch.chunk
    return sum(16 * (s[0] // world_size + (rank < s[0] % world_size)) * math.prod(s[1:]) for s in shapes.values())


def no_gradients(shapes, world_size, rank):  # "gradients are freed": param and Adam's two states only
    return fsdp_dense_bytes(shapes, world_size, rank) * 12 // 16


def the_check_tower(shapes, world_size, rank):  # its own tower read inside, not the shapes it is handed
    return fsdp_dense_bytes(lab07.dense_shapes(), world_size, rank)


def two_dims_at_most(shapes, world_size, rank):  # a row's size read as shape[1]: right for Linear layers only
    total = 0
    for shape in shapes.values():
        per_rank = math.ceil(shape[0] / world_size)
        total += 16 * max(0, min(per_rank, shape[0] - rank * per_rank)) * (shape[1] if len(shape) > 1 else 1)
    return total


MEASURED = {}  # (world_size, rank) -> bytes, typed in from the check's messages


def the_measurements_looked_up(shapes, world_size, rank):
    if not MEASURED:
        MEASURED.update({(w, r): b for w in (2, 3) for r, b in enumerate(lab07.measured_dense_bytes(w))})
    return MEASURED[world_size, rank]


def not_written(shapes, world_size, rank):
    raise NotImplementedError()


def test_bytes_check_accepts_the_solution(capsys):
    lab07.check_dense_bytes(fsdp_dense_bytes)
    assert capsys.readouterr().out.startswith("✓")


def test_bytes_check_accepts_a_numpy_integer(capsys):
    import numpy as np

    lab07.check_dense_bytes(lambda shapes, world_size, rank: np.int64(fsdp_dense_bytes(shapes, world_size, rank)))
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (ddp_bytes, "under DDP"),
        (even_split, "even split"),
        (ceil_rows_everywhere, "not every rank gets ceil"),
        (params_only, "count the gradient"),
        (lambda shapes, world_size, rank: "many", "return a number"),
        (not_written, "not written yet"),
        (floor_rows, "you predicted"),
        (last_rank_gets_the_rest, "you predicted"),
        (cut_the_last_dim, "you predicted"),
        (remainder_to_the_first_ranks, "numpy.array_split"),
        (no_gradients, "count the gradient too"),
        (the_check_tower, r"(?s)fsdp_dense_bytes\(\{'a': \(5, 3\), .*\}, 4, 0\) = 5072; FSDP2 \(torch.chunk\) keeps 240 "
                          r"bytes there: .*use the shapes argument"),
        (two_dims_at_most, r"(?s)'e': \(3, 2, 2\)\}, 4, 0\) = 208; FSDP2 \(torch.chunk\) keeps 240 bytes there: the 3-D "
                           r"parameter 'e' .*math.prod\(shape\[1:\]\), not shape\[1\]"),
        (the_measurements_looked_up, r"fsdp_dense_bytes\(.*, 4, 0\) raised KeyError: \(4, 0\): the formula is right "
                                     r"for the check's tower only"),
    ],
)
def test_bytes_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab07.check_dense_bytes(wrong)


def test_the_fresh_shapes_reference_is_the_solution():
    for rank in range(lab07._FRESH_WORLD_SIZE):
        want = fsdp_dense_bytes(lab07._FRESH_SHAPES, lab07._FRESH_WORLD_SIZE, rank)
        assert lab07._chunk_bytes(lab07._FRESH_SHAPES, lab07._FRESH_WORLD_SIZE, rank) == want
    assert [lab07._chunk_bytes({"p": (5,)}, 4, rank) for rank in range(4)] == [32, 32, 16, 0]


def test_the_solution_formula_is_torch_chunk():
    import torch

    for rows in (1, 2, 5, 24, 26):
        for world_size in (2, 3, 4):
            chunks = torch.arange(rows).chunk(world_size)
            for rank in range(world_size):
                want = 16 * (len(chunks[rank]) if rank < len(chunks) else 0)
                assert fsdp_dense_bytes({"p": (rows,)}, world_size, rank) == want


def test_bytes_check_rejects_an_answer_that_empties_the_shapes_it_was_given():
    def consuming(shapes, world_size, rank):  # the right bytes, but the caller's dict is empty afterwards
        copy = dict(shapes)
        shapes.clear()
        return fsdp_dense_bytes(copy, world_size, rank)

    with pytest.raises(CheckFailed, match=r"fsdp_dense_bytes changed its argument 1 \(a dict\) in place"):
        lab07.check_dense_bytes(consuming)
