"""course_lib.trace records the collectives that really ran on each rank, with the right names and sizes."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

from course_lib import launch, trace

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def known_collectives():
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from course_lib import trace

    rank = dist.get_rank()
    with trace.collectives() as log:
        with log.phase("setup"):
            dist.all_reduce(torch.ones(10))  # 10 float32 = 40 bytes, in place
        with log.phase("exchange"):
            out = torch.empty(8, dtype=torch.int64)
            dist.all_to_all_single(out, torch.arange(8) + 100 * rank)  # 8 int64 = 64 bytes each way
            gathered = [torch.empty(3) for _ in range(2)]
            dist.all_gather(gathered, torch.ones(3))
            scattered = torch.empty(4, 2)
            dist.reduce_scatter_tensor(scattered, torch.ones(8, 2))
            dist.broadcast(torch.ones(5, dtype=torch.float64), src=0)
            funcol.all_reduce(torch.ones(6), "sum", dist.group.WORLD).wait()
        untraced = torch.ones(1)
    dist.all_reduce(untraced)  # after the block: not recorded
    return log.records, out.tolist()


@pytest.fixture(scope="module")
def known():
    return launch(known_collectives, world_size=2, show_ranks=[])


def test_all_reduce_and_all_to_all_are_recorded_with_names_and_bytes(known):
    for rank, (records, _) in enumerate(known):
        first, second = records[0], records[1]
        assert (first.op, first.phase, first.dtype) == ("all_reduce", "setup", "float32")
        assert (first.in_shapes, first.out_shapes, first.bytes_in, first.bytes_out) == (((10,),), ((10,),), 40, 40)
        assert (second.op, second.phase, second.dtype) == ("all_to_all", "exchange", "int64")
        assert (second.bytes_in, second.bytes_out, second.group_size) == (64, 64, 2)
        assert second.operator == "c10d.alltoall_base_"


def test_every_collective_in_the_block_is_recorded_once_in_order(known):
    for records, exchanged in known:
        assert [r.op for r in records] == [
            "all_reduce", "all_to_all", "all_gather", "reduce_scatter", "broadcast", "all_reduce",
        ]
    assert known[0][1] == [0, 1, 2, 3, 100, 101, 102, 103]  # and the collectives still did their job


def test_list_and_functional_collectives_have_their_sizes(known):
    records = known[0][0]
    gather, scatter, broadcast, functional = records[2:6]
    assert (gather.in_shapes, gather.out_shapes, gather.bytes_in, gather.bytes_out) == (((3,),), ((3,), (3,)), 12, 24)
    assert (scatter.in_shapes, scatter.out_shapes) == (((8, 2),), ((4, 2),))
    assert (scatter.bytes_in, scatter.bytes_out) == (64, 32)
    assert (broadcast.dtype, broadcast.bytes_in) == ("float64", 40)
    assert functional.operator == "_c10d_functional.all_reduce"
    assert (functional.bytes_in, functional.bytes_out, functional.group_size) == (24, 24, 2)


def backward_collectives():
    import torch
    import torch.distributed as dist

    from course_lib import trace

    class AllReduceGrad(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            grad = grad.clone()
            dist.all_reduce(grad)
            return grad

    weight = torch.ones(4, requires_grad=True)
    with trace.collectives() as log:
        with log.phase("forward"):
            loss = AllReduceGrad.apply(weight).sum()
        with log.phase("backward"):
            loss.backward()
        with log.phase("outer"):
            with log.phase("inner"):
                dist.barrier()
            dist.all_reduce(torch.ones(2))
    return [(r.phase, r.op, r.bytes_in) for r in log.records]


def test_collectives_in_backward_and_nested_phases():
    records = launch(backward_collectives, world_size=2, show_ranks=[])[0]
    assert records == [("backward", "all_reduce", 16), ("inner", "barrier", 0), ("outer", "all_reduce", 8)]


def profiled_and_traced():
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile

    from course_lib import trace

    def work():
        dist.all_reduce(torch.ones(10))
        dist.all_to_all_single(torch.empty(8), torch.ones(8))
        dist.all_gather_into_tensor(torch.empty(6), torch.ones(3))
        dist.reduce_scatter_tensor(torch.empty(4), torch.ones(8))

    # Separately: under the dispatch mode the profiler would see each operator at two dispatch levels.
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        work()
    with trace.collectives() as log:
        work()
    profiled = [e.name.removeprefix("c10d::") for e in prof.events() if e.name.startswith("c10d::")]
    traced = [r.operator.removeprefix("c10d.") for r in log.records]
    return profiled, traced


def test_trace_agrees_with_torch_profiler():
    profiled, traced = launch(profiled_and_traced, world_size=2, show_ranks=[])[0]
    assert traced == ["allreduce_", "alltoall_base_", "_allgather_base_", "_reduce_scatter_base_"]
    assert profiled == traced


def fake(op, phase, dtype="float32", n=4):
    return trace.Collective(op, phase, dtype, ((n,),), ((n,),), 4 * n, 4 * n, 2, f"c10d.{op}")


def test_table_and_summary():
    by_rank = [
        [fake("all_to_all", "forward", "int64"), fake("all_to_all", "forward"), fake("all_to_all", "forward")],
        [fake("all_to_all", "forward", "int64"), fake("all_to_all", "forward")],
    ]
    table = trace.table(by_rank)
    assert list(table["rank"]) == [0, 0, 0, 1, 1]
    assert list(table.columns) == ["rank", "phase", "collective", "dtype", "in shapes", "out shapes", "bytes in", "bytes out"]
    summary = trace.summary(by_rank)
    assert summary.to_dict("records") == [
        {"phase": "forward", "collective": "all_to_all", "dtype": "int64", "calls per rank": "1", "bytes in": 32, "bytes out": 32},
        {"phase": "forward", "collective": "all_to_all", "dtype": "float32", "calls per rank": "2/1", "bytes in": 48, "bytes out": 48},
    ]
    assert len(trace.table(by_rank[0])) == 3  # one rank's list works too


def test_every_mapped_operator_exists_in_this_torch():
    import torch
    import torch.distributed  # noqa: F401  (registers the c10d operators)

    for name in trace.OPS:
        namespace, op = name.split(".")
        assert hasattr(getattr(torch.ops, namespace), op), name


def sub_group_collectives():
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    from course_lib import trace

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    pair = pairs[dist.get_rank() // 2]
    with trace.collectives() as log:
        dist.all_gather([torch.empty(3) for _ in range(2)], torch.ones(3), group=pair)
        dist.all_gather_into_tensor(torch.empty(6), torch.ones(3), group=pair)
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(4), group=pair)
        dist.all_reduce(torch.ones(2), group=pair)
        funcol.all_reduce(torch.ones(2), "sum", pair).wait()
        dist.all_reduce(torch.ones(2))  # the whole world
    return [(r.op, r.group_size) for r in log.records], log.records


def test_collectives_on_a_sub_group_report_the_sub_group_size():
    import warnings

    with warnings.catch_warnings():  # 4 ranks on a 2-core machine: launch warns that they take turns
        warnings.simplefilter("ignore", UserWarning)
        by_rank = launch(sub_group_collectives, world_size=4, show_ranks=[])
    for records, _ in by_rank:
        assert records == [
            ("all_gather", 2), ("all_gather", 2), ("reduce_scatter", 2), ("all_reduce", 2), ("all_reduce", 2),
            ("all_reduce", 4),
        ]


def test_collectives_on_a_sub_group_report_its_ranks_and_groups_reads_them():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        by_rank = launch(sub_group_collectives, world_size=4, show_ranks=[])
    for rank, (_, records) in enumerate(by_rank):
        pair = (0, 1) if rank < 2 else (2, 3)
        assert [r.group_ranks for r in records] == [pair] * 5 + [(0, 1, 2, 3)]
    found = trace.groups([records for _, records in by_rank], ranks_per_host=2)
    assert found["collective"].tolist() == ["all_gather", "reduce_scatter", "all_reduce"]
    assert found["groups"].tolist() == ["{0,1} {2,3}", "{0,1} {2,3}", "{0,1} {2,3} {0,1,2,3}"]
    assert found["crosses hosts"].tolist() == [False, False, True]
    assert "crosses hosts" not in trace.groups([records for _, records in by_rank]).columns
