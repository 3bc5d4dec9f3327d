"""Which collectives ran, with their sizes, on this rank: recorded from the calls that really ran.

    from course_lib import trace

    def fn():                                   # runs on every rank, e.g. under launch()
        with trace.collectives() as log:
            with log.phase("forward"):
                out = model(batch).wait()
            with log.phase("backward"):
                loss(out).backward()
        return log.records                      # plain data: travels back from the rank

    records_by_rank = launch(fn, world_size=2)
    trace.table(records_by_rank)                # one row per collective call, per rank
    trace.summary(records_by_rank)              # one row per (phase, collective): calls and bytes

How it sees them: every collective, whoever calls it (``torch.distributed.all_to_all_single``, a DDP
gradient hook in C++, torchrec's own comm ops, functional collectives, ``torch.ops.c10d`` directly), reaches
the backend through one of the dispatcher operators in the ``c10d`` or ``_c10d_functional`` namespaces. A
``TorchDispatchMode`` sees each such operator call with its real tensors, before the backend runs it. So a
record is a collective that was issued on this rank, with the shapes and dtype it moved; nothing is
inferred from a model's configuration. (torch.profiler shows the same calls as ``c10d::...`` events, but
without the tensor sizes of list arguments and with profiler chatter on stderr; tests/test_trace.py
checks the two agree.)

Sizes: ``bytes_in`` is what this rank hands to the collective (its input tensors), ``bytes_out`` what it
gets back (its output tensors). For an in-place collective (``all_reduce``, ``broadcast``) they are the
same tensor. Backends may implement one collective with another (gloo runs a reduce-scatter as an
all-reduce internally); a record names the collective that was asked for, as NCCL would run it.
"""
from __future__ import annotations

import contextlib
from dataclasses import asdict, dataclass
from typing import Any, Iterator, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["Collective", "CollectiveLog", "collectives", "table", "summary", "groups", "OPS"]


@dataclass(frozen=True)
class Collective:
    """One collective call on one rank."""

    op: str  # canonical name: "all_reduce", "all_to_all", "reduce_scatter", "all_gather", "broadcast", ...
    phase: str  # the label of the enclosing ``log.phase(...)``, "" outside any
    dtype: str  # e.g. "float32", "int64"; several joined by "+" when the tensors differ
    in_shapes: tuple[tuple[int, ...], ...]
    out_shapes: tuple[tuple[int, ...], ...]
    bytes_in: int
    bytes_out: int
    group_size: int
    operator: str  # the dispatcher operator that ran, e.g. "c10d.alltoall_base_"
    group_ranks: tuple[int, ...] = ()  # the global ranks of its process group, e.g. (0, 2)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


# dispatcher operator -> (canonical op, argument names holding inputs, argument names holding outputs).
# "=in" as output means "the inputs, updated in place"; "<result>" means "what the operator returned".
_IN_PLACE, _RESULT = "=in", "<result>"
OPS: dict[str, tuple[str, tuple[str, ...], tuple[str, ...]]] = {
    "c10d.allreduce_": ("all_reduce", ("tensors",), (_IN_PLACE,)),
    "c10d.allreduce_coalesced_": ("all_reduce", ("tensors",), (_IN_PLACE,)),
    "c10d.allgather_": ("all_gather", ("input_tensors",), ("output_tensors",)),
    "c10d.allgather_coalesced_": ("all_gather", ("input_list",), ("output_lists",)),
    "c10d.allgather_into_tensor_coalesced_": ("all_gather", ("inputs",), ("outputs",)),
    "c10d._allgather_base_": ("all_gather", ("input_tensor",), ("output_tensor",)),
    "c10d.reduce_scatter_": ("reduce_scatter", ("input_tensors",), ("output_tensors",)),
    "c10d._reduce_scatter_base_": ("reduce_scatter", ("input_tensor",), ("output_tensor",)),
    "c10d.reduce_scatter_tensor_coalesced_": ("reduce_scatter", ("inputs",), ("outputs",)),
    "c10d.alltoall_": ("all_to_all", ("input_tensors",), ("output_tensors",)),
    "c10d.alltoall_base_": ("all_to_all", ("input",), ("output",)),
    "c10d.broadcast_": ("broadcast", ("tensors",), (_IN_PLACE,)),
    "c10d.reduce_": ("reduce", ("tensors",), (_IN_PLACE,)),
    "c10d.gather_": ("gather", ("input_tensors",), ("output_tensors",)),
    "c10d.scatter_": ("scatter", ("input_tensors",), ("output_tensors",)),
    "c10d.send": ("send", ("tensors",), ()),
    "c10d.recv_": ("recv", (), ("tensors",)),
    "c10d.recv_any_source_": ("recv", (), ("tensors",)),
    "c10d.barrier": ("barrier", (), ()),
    "c10d.monitored_barrier_": ("barrier", (), ()),
    "_c10d_functional.all_reduce": ("all_reduce", ("input",), (_RESULT,)),
    "_c10d_functional.all_reduce_": ("all_reduce", ("input",), (_IN_PLACE,)),
    "_c10d_functional.all_reduce_coalesced": ("all_reduce", ("inputs",), (_RESULT,)),
    "_c10d_functional.all_reduce_coalesced_": ("all_reduce", ("inputs",), (_IN_PLACE,)),
    "_c10d_functional.all_gather_into_tensor": ("all_gather", ("input",), (_RESULT,)),
    "_c10d_functional.all_gather_into_tensor_out": ("all_gather", ("input",), (_RESULT,)),
    "_c10d_functional.all_gather_into_tensor_coalesced": ("all_gather", ("inputs",), (_RESULT,)),
    "_c10d_functional.reduce_scatter_tensor": ("reduce_scatter", ("input",), (_RESULT,)),
    "_c10d_functional.reduce_scatter_tensor_out": ("reduce_scatter", ("input",), (_RESULT,)),
    "_c10d_functional.reduce_scatter_tensor_coalesced": ("reduce_scatter", ("inputs",), (_RESULT,)),
    "_c10d_functional.all_to_all_single": ("all_to_all", ("input",), (_RESULT,)),
    "_c10d_functional.broadcast": ("broadcast", ("input",), (_RESULT,)),
    "_c10d_functional.broadcast_": ("broadcast", ("input",), (_IN_PLACE,)),
    "_c10d_functional.isend": ("send", ("tensor",), ()),
    "_c10d_functional.irecv": ("recv", (), (_RESULT,)),
}
_NAMESPACES = frozenset(name.split(".")[0] for name in OPS)


def _tensors(value: Any) -> list[torch.Tensor]:
    """Every tensor in a (nested list of) tensor argument, in order."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _bind(func: Any, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The operator's arguments by schema name."""
    bound = dict(kwargs)
    for arg, value in zip(func._schema.arguments, args):
        bound[arg.name] = value
    return bound


def _group(bound: dict[str, Any]) -> tuple[int, tuple[int, ...]]:
    """The size of the group the collective ran on (a sub-group's size, not the world's) and its global ranks
    (empty where they cannot be known)."""
    import torch.distributed as dist

    group = bound.get("process_group")
    if group is not None and isinstance(group, torch.ScriptObject):
        # c10d operators receive the group as a TorchScript object (no Python methods): unbox it.
        group = dist.ProcessGroup.unbox(group)
    elif group is None and "group_name" in bound:
        from torch.distributed.distributed_c10d import _resolve_process_group

        group = _resolve_process_group(bound["group_name"])
    if group is None and dist.is_initialized():
        group = dist.group.WORLD
    ranks: tuple[int, ...] = ()
    if group is not None:
        try:
            ranks = tuple(dist.get_process_group_ranks(group))
        except (RuntimeError, ValueError, KeyError):  # a group the Python side does not know
            ranks = ()
    if "group_size" in bound:
        size = int(bound["group_size"])
    elif group is not None:
        size = int(group.size())
    else:
        size = 1
    return size, ranks


def _describe(func: Any, args: tuple, kwargs: dict, result: Any, phase: str) -> Collective | None:
    operator = f"{func.namespace}.{func._opname}"  # e.g. "c10d.alltoall_base_"
    if operator not in OPS:
        return None  # e.g. wait_tensor, check_for_nan: not collectives
    op, in_names, out_names = OPS[operator]
    bound = _bind(func, args, kwargs)
    inputs = [t for name in in_names for t in _tensors(bound.get(name))]
    outputs: list[torch.Tensor] = []
    for name in out_names:
        if name == _IN_PLACE:
            outputs += inputs
        elif name == _RESULT:
            outputs += _tensors(result)
        else:
            outputs += _tensors(bound.get(name))
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in inputs + outputs})
    group_size, group_ranks = _group(bound)
    return Collective(
        op=op,
        phase=phase,
        dtype="+".join(dtypes),
        in_shapes=tuple(tuple(t.shape) for t in inputs),
        out_shapes=tuple(tuple(t.shape) for t in outputs),
        bytes_in=sum(t.numel() * t.element_size() for t in inputs),
        bytes_out=sum(t.numel() * t.element_size() for t in outputs),
        group_size=group_size,
        operator=operator,
        group_ranks=group_ranks,
    )


class CollectiveLog(TorchDispatchMode):
    """Records every collective issued on this rank while active; see :func:`collectives`."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[Collective] = []
        self._phase = ""

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Label the collectives issued inside this block (e.g. "forward", "backward")."""
        outer, self._phase = self._phase, name
        try:
            yield
        finally:
            self._phase = outer

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if func.namespace in _NAMESPACES:
            record = _describe(func, args, kwargs, result, self._phase)
            if record is not None:
                self.records.append(record)
        return result

    def ops(self) -> list[str]:
        """The canonical op names, in the order they ran."""
        return [r.op for r in self.records]


def collectives() -> CollectiveLog:
    """Record the collectives issued on this rank inside a ``with`` block.

    ``with trace.collectives() as log: ...`` then ``log.records`` is a list of :class:`Collective`, in
    call order, each with its op, phase, shapes, dtype and bytes. Use it inside the function a rank runs
    (it sees this rank's calls only); return ``log.records`` to look at them in the notebook.
    """
    return CollectiveLog()


def _by_rank(records_by_rank: Sequence[Sequence[Collective]] | Sequence[Collective]) -> list[Sequence[Collective]]:
    if records_by_rank and isinstance(records_by_rank[0], Collective):
        return [records_by_rank]  # type: ignore[list-item]
    return list(records_by_rank)  # type: ignore[arg-type]


def _shapes(shapes: tuple[tuple[int, ...], ...]) -> str:
    if not shapes:
        return "-"
    text = [("[" + ", ".join(map(str, s)) + "]") for s in shapes]
    if len(text) > 3:
        return f"{', '.join(text[:2])}, ... ({len(text)} tensors)"
    return ", ".join(text)


def table(records_by_rank: Sequence[Sequence[Collective]] | Sequence[Collective]) -> "pandas.DataFrame":  # noqa: F821
    """One row per collective call: rank, phase, op, dtype, input and output shapes, bytes in and out.

    `records_by_rank[r]` is rank r's ``log.records`` (what ``launch`` returns), or a single rank's list.
    """
    import pandas as pd

    rows = [
        {
            "rank": rank,
            "phase": r.phase,
            "collective": r.op,
            "dtype": r.dtype,
            "in shapes": _shapes(r.in_shapes),
            "out shapes": _shapes(r.out_shapes),
            "bytes in": r.bytes_in,
            "bytes out": r.bytes_out,
        }
        for rank, records in enumerate(_by_rank(records_by_rank))
        for r in records
    ]
    columns = ["rank", "phase", "collective", "dtype", "in shapes", "out shapes", "bytes in", "bytes out"]
    return pd.DataFrame(rows, columns=columns)


def summary(records_by_rank: Sequence[Sequence[Collective]] | Sequence[Collective]) -> "pandas.DataFrame":  # noqa: F821
    """One row per (phase, collective, dtype), in the order they first ran: calls per rank, bytes over all ranks.

    "calls per rank" reads "3" when every rank made 3 such calls, "3/2" when rank 0 made 3 and rank 1 two.
    "bytes in" and "bytes out" add up what every rank handed to those calls and got back from them.
    """
    import pandas as pd

    per_rank = _by_rank(records_by_rank)
    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for rank, records in enumerate(per_rank):
        for r in records:
            row = rows.setdefault(
                (r.phase, r.op, r.dtype),
                {"phase": r.phase, "collective": r.op, "dtype": r.dtype, "calls": [0] * len(per_rank),
                 "bytes in": 0, "bytes out": 0},
            )
            row["calls"][rank] += 1
            row["bytes in"] += r.bytes_in
            row["bytes out"] += r.bytes_out
    out = []
    for row in rows.values():
        calls = row.pop("calls")
        row["calls per rank"] = str(calls[0]) if len(set(calls)) == 1 else "/".join(map(str, calls))
        out.append(row)
    columns = ["phase", "collective", "dtype", "calls per rank", "bytes in", "bytes out"]
    return pd.DataFrame(out, columns=columns)


def _ranks_text(ranks: Sequence[int]) -> str:
    return "{" + ",".join(map(str, ranks)) + "}"


def groups(
    records_by_rank: Sequence[Sequence[Collective]] | Sequence[Collective], ranks_per_host: int | None = None
) -> "pandas.DataFrame":  # noqa: F821
    """One row per (phase, collective, dtype), in the order they first ran: the process groups it ran on.

    "groups" lists each distinct group (its global ranks) that such a call ran on, over all ranks, e.g.
    ``{0,1} {2,3}``. With `ranks_per_host` (torchrun's ``LOCAL_WORLD_SIZE``: rank r is on host
    ``r // ranks_per_host``), "crosses hosts" says whether any of those groups holds ranks of two hosts.
    """
    import pandas as pd

    rows: dict[tuple[str, str, str], dict[str, Any]] = {}
    for records in _by_rank(records_by_rank):
        for r in records:
            row = rows.setdefault((r.phase, r.op, r.dtype), {"phase": r.phase, "collective": r.op, "dtype": r.dtype, "groups": []})
            if r.group_ranks not in row["groups"]:
                row["groups"].append(r.group_ranks)
    out = []
    for row in rows.values():
        found = sorted(row["groups"], key=lambda g: (len(g), g))
        row["groups"] = " ".join(_ranks_text(g) if g else "?" for g in found)
        if ranks_per_host is not None:
            row["crosses hosts"] = any(len({rank // ranks_per_host for rank in g}) > 1 for g in found)
        out.append(row)
    columns = ["phase", "collective", "dtype", "groups"] + (["crosses hosts"] if ranks_per_host is not None else [])
    return pd.DataFrame(out, columns=columns)
