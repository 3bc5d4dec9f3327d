"""Checks for 01_collectives: route ids to their owning rank with all_to_all_single, a global mean, and each
rank's slice of a sum (the learner chooses the collective).

Each check launches the learner's function on 2 and then 3 ranks, with inputs of unequal sizes (so that
assuming equal counts gives a wrong answer), and compares every rank's result with the answer worked out
here, on one process, from all ranks' inputs.
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable

from course_lib.checks import INPUT_CHANGED_HINT, call_unchanged, exercise, fail, passed

# torch.distributed functions that communicate; the checks count the learner's calls to them.
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_gather_object",
    "gather",
    "gather_object",
    "scatter",
    "scatter_object_list",
    "broadcast_object_list",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "send",
    "recv",
    "isend",
    "irecv",
)

_TIMEOUT_S = 30.0
_REPRODUCE_ROUTE = (
    "ids_by_rank, row_offsets, num_rows = lab01.route_example(2); "
    "launch(lambda: route_ids(ids_by_rank[dist.get_rank()], row_offsets))"
)
_REPRODUCE_MEAN = "values = lab01.mean_example(2); launch(lambda: global_mean(values[dist.get_rank()]))"


# ------------------------------------------------------------------------------------------ the data


def route_example(world_size: int = 2) -> tuple[list[Any], list[int], int]:
    """The ids each rank holds in the routing exercise, each rank's first row (the row-wise shards' offsets), and
    the number of rows of the table.

    Ranks hold different numbers of ids and send different numbers to each owner. On 2 ranks the shards are
    uneven: rank 0 owns rows 0 to 2, rank 1 the other 7. On 3 ranks they are TorchRec's even split of 10 rows,
    4, 4 and 2; some ids occur on several ranks, and one rank sends nothing to two of the owners. Both hold ids
    that sit on a shard's first row.
    """
    import torch

    examples = {
        2: ([[7, 1, 3, 9, 0, 8, 6], [2, 5, 4]], [0, 3], 10),
        3: ([[9, 5, 0, 8, 5, 2], [3, 1, 2], [8, 4, 7, 6, 9, 0, 1]], [0, 4, 8], 10),
    }
    if world_size not in examples:
        raise ValueError(f"there are examples for 2 and 3 ranks, not {world_size}")
    ids, offsets, num_rows = examples[world_size]
    return [torch.tensor(x, dtype=torch.int64) for x in ids], list(offsets), num_rows


def unseen_route_cases() -> list[tuple[list[Any], list[int], int]]:
    """Two cases the lab does not show, on 3 ranks: an empty shard in the middle (16 rows as 6, 0 and 10), with ids
    on the boundary it shares with the next shard; and an empty last shard (9 rows as 2, 7 and 0), with a rank
    holding enough ids that an unstable sort reorders them."""
    import torch

    middle = ([[12, 3, 7, 0, 6], [5, 11, 2, 9, 4, 6, 15], [1, 10, 6]], [0, 6, 6], 16)
    many = [4, 1, 2, 7, 0, 3, 5, 8, 1, 6, 2, 0, 4, 7, 3, 1, 8, 5, 2, 6, 0, 3, 7, 1]
    last = ([many, [2, 0, 8, 1], [5]], [0, 2, 9], 9)
    return [([torch.tensor(x, dtype=torch.int64) for x in ids], offsets, rows) for ids, offsets, rows in (middle, last)]


def mean_example(world_size: int = 2) -> list[Any]:
    """The values each rank holds in the global-mean exercise: a different number on each rank."""
    import torch

    values = [[3.0, 5.0], [1.0, 2.0, 0.0, 1.0, 2.0, 0.0], [6.0, 9.0, 3.0]]
    if not 2 <= world_size <= len(values):
        raise ValueError(f"there are examples for 2 and 3 ranks, not {world_size}")
    return [torch.tensor(v) for v in values[:world_size]]


def row_owner(ids: Any, row_offsets: list[int]) -> Any:
    """Range ownership as in TorchRec's row-wise shards: rank r owns the rows from row_offsets[r] up to the next
    rank's first row (the last rank: up to the end of the table); an empty shard starts where the next shard starts,
    and an empty last shard at the end of the table."""
    import torch

    return torch.searchsorted(torch.tensor(row_offsets, dtype=ids.dtype), ids, right=True) - 1


def _modulo_owner(ids: Any, row_offsets: list[int]) -> Any:
    return ids % len(row_offsets)


def _expected_routing(ids_by_rank: list[Any], row_offsets: list[int], owner: Callable[..., Any] = row_owner) -> list[Any]:
    import torch

    return [torch.cat([ids[owner(ids, row_offsets) == rank] for ids in ids_by_rank]) for rank in range(len(ids_by_rank))]


def _owned(rank: int, row_offsets: list[int], num_rows: int) -> str:
    """The rows a rank owns, in words: "rows [3, 10)", or "no rows"."""
    start = row_offsets[rank]
    stop = row_offsets[rank + 1] if rank + 1 < len(row_offsets) else num_rows
    return f"rows [{start}, {stop})" if stop > start else "no rows"


# --------------------------------------------------------------------------------- running on ranks


def _all_to_all_elements(name: str, args: tuple, kwargs: dict) -> int:
    """How many values an all_to_all(_single) or reduce_scatter call is handed to send from this rank (0 for any
    other collective)."""
    import torch

    if name == "all_to_all_single":
        sent = kwargs.get("input", args[1] if len(args) > 1 else None)
    elif name == "all_to_all":
        sent = kwargs.get("input_tensor_list", args[1] if len(args) > 1 else None)
    elif name in ("reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor"):
        sent = kwargs.get("input_list", kwargs.get("input", args[1] if len(args) > 1 else None))
    else:
        return 0
    if isinstance(sent, torch.Tensor):
        return sent.numel()
    if isinstance(sent, (list, tuple)):
        return sum(t.numel() for t in sent if isinstance(t, torch.Tensor))
    return 0


def _call_counting(
    fn: Callable[..., Any], args_by_rank: list[tuple], record: Callable[[str, tuple, dict], None] | None = None
) -> tuple[Any, list[str]]:
    """On each rank: call fn(*args_by_rank[rank]) and note which collectives it called (outermost only); with
    `record`, also call ``record(name, args, kwargs)`` before each of those calls runs."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    calls: list[str] = []
    depth = 0

    def counted(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            nonlocal depth
            if depth == 0:
                calls.append(name)
                if record is not None:
                    record(name, args, kwargs)
            depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                depth -= 1

        return call

    saved: list[tuple[Any, str, Any]] = []
    for name in COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None:
            continue
        wrapper = counted(name, original)
        for module in (dist, c10d):
            if getattr(module, name, None) is original:
                saved.append((module, name, original))
                setattr(module, name, wrapper)
    try:
        result = call_unchanged(getattr(fn, "__name__", "your function"), fn, *args_by_rank[dist.get_rank()])
    finally:
        for module, name, original in saved:
            setattr(module, name, original)
    return result, calls


def _routing_on_rank(fn: Callable[..., Any], args_by_rank: list[tuple]) -> tuple[Any, list[str], int]:
    """On each rank: :func:`_call_counting`, and how many values this rank sent by all-to-all in all."""
    sent: list[int] = []
    result, calls = _call_counting(fn, args_by_rank, lambda name, args, kwargs: sent.append(_all_to_all_elements(name, args, kwargs)))
    return result, calls, sum(sent)


def _run(
    fn: Callable[..., Any],
    args_by_rank: list[tuple],
    what: str,
    reproduce: str,
    launch: Callable[..., list[Any]] | None,
    timeout: float,
    on_rank: Callable[..., Any] = _call_counting,
) -> list[tuple[Any, ...]]:
    """Launch fn on len(args_by_rank) ranks, counting collectives (`on_rank`); turn a failed launch into a CheckFailed."""
    from course_lib.launcher.launch import LaunchError

    if launch is None:
        from course_lib import launch
    world = len(args_by_rank)
    try:
        with warnings.catch_warnings():  # 3 ranks on a 2-core laptop is fine for a check
            warnings.simplefilter("ignore", UserWarning)
            return launch(on_rank, fn, args_by_rank, world_size=world, show_ranks=[], timeout=timeout)
    except LaunchError as error:
        raised = [f for f in error.failures if f.kind == "raised"]
        if raised and all(f.exc_type == "NotImplementedError" for f in raised):
            fail(f"{what} is not written yet", "replace `raise NotImplementedError()` with your code")
        _fail_if_input_changed(error, world)
        first = error.failures[0].headline() if error.failures else error.summary
        fail(f"{what} failed on {world} ranks: {first}", _launch_hint(str(error), reproduce))


def _fail_if_input_changed(error: Any, world: int) -> None:
    """A launch that failed because the answer changed the tensor it was handed (call_unchanged, on the rank)."""
    changed = [f for f in error.failures if f.kind == "raised" and f.exc_type == "InputChanged"]
    if changed:
        fail(f"on {world} ranks, rank {changed[0].rank}: {changed[0].message.strip()}", INPUT_CHANGED_HINT)


def _launch_hint(text: str, reproduce: str) -> str:
    """What a failed launch of an exercise most likely means."""
    if any(s in text for s in ("divide equally", "Split sizes", "LengthPerRank", "SIGABRT")):
        # gloo checks split sizes locally ("divide equally", alltoallv's LengthPerRank) or aborts the
        # process (SIGABRT) when the bytes that arrive do not fit the output it was given.
        return (
            "the ranks disagreed about how many values travel: a receiver must know how many come from each "
            "rank, so exchange the counts first (all_to_all_single on a tensor of per-destination counts), "
            "then pass them as output_split_sizes"
        )
    if "% context->size" in text:  # gloo's all-to-all without splits: the tensor does not divide by the ranks
        return (
            "a tensor sent by all_to_all_single without split sizes must hold the same number of values for every "
            "rank: a counts tensor needs exactly world_size entries. An owner of world_size or more makes it "
            "longer: every id's owner is a rank, and the last rank owns every row from its offset to the end"
        )
    if "non-negative" in text:  # torch.bincount of an owner of -1
        return (
            "an owner came out negative: id 0 is rank 0's first row, and an id equal to a shard's first row "
            "belongs to that shard. torch.searchsorted's `right` argument decides which side of an equal value it returns"
        )
    if "never finished" in text or "timed out" in text or "Connection closed" in text or "Connection reset" in text:
        return (
            "a rank waited in a collective that another rank never called: every rank must call the same "
            "collectives in the same order"
        )
    return f"run it yourself to read each rank's traceback: {reproduce}"


def _describe_calls(calls: list[str]) -> str:
    return ", ".join(calls) if calls else "no collective"


# ----------------------------------------------------------------------------------- route_ids


@exercise
def check_route_ids(
    route_ids: Callable[..., Any],
    launch: Callable[..., list[Any]] | None = None,
    timeout: float = _TIMEOUT_S,
) -> None:
    """Run `route_ids(ids, row_offsets)` on the lab's 2- and 3-rank examples and on two 3-rank cases it does not show
    (an empty shard in the middle, an empty last shard), and compare what each rank received and how many values it
    sent."""
    import torch

    cases = [route_example(2), route_example(3), *unseen_route_cases()]
    for number, (ids_by_rank, row_offsets, num_rows) in enumerate(cases):
        world = len(ids_by_rank)
        where = f"on {world} ranks with row_offsets {row_offsets}" + (" (not in the lab)" if number >= 2 else "")
        args = [(ids.clone(), list(row_offsets)) for ids in ids_by_rank]
        outcomes = _run(route_ids, args, "route_ids", _REPRODUCE_ROUTE, launch, timeout, on_rank=_routing_on_rank)
        expected = _expected_routing(ids_by_rank, row_offsets)
        modulo = _expected_routing(ids_by_rank, row_offsets, _modulo_owner)
        got = [result for result, _, _ in outcomes]
        for rank, result in enumerate(got):
            if not isinstance(result, torch.Tensor):
                fail(f"{where}, rank {rank} returned {type(result).__name__}", "return the tensor of ids this rank received")
            if result.dtype != ids_by_rank[rank].dtype:
                fail(
                    f"{where}, rank {rank} returned {result.dtype} ids",
                    "ids are integers: allocate the receiving tensor with dtype=ids.dtype (torch.empty(n, dtype=ids.dtype))",
                )
        if all(_same_multiset(g, m) for g, m in zip(got, modulo)) and not all(
            _same_multiset(g, e) for g, e in zip(got, expected)
        ):
            fail(
                f"{where}, ids went to rank id % {world}",
                "rows are owned in ranges: rank r owns the rows from row_offsets[r] up to the next rank's first row",
            )

        def not_its_own(rank: int, result: Any, want: Any) -> None:
            strangers = sorted({int(i) for i in result.reshape(-1).tolist()} - {int(i) for i in want.tolist()})
            if not strangers:
                return
            owns = _owned(rank, row_offsets, num_rows)
            if owns == "no rows":
                hint = (f"rank {rank}'s shard is empty: its offset, {row_offsets[rank]}, is also the next rank's first "
                        "row, and that row belongs to the next rank. Count an empty shard's offset as the next one's")
            elif all(i in row_offsets for i in strangers):
                first = strangers[0]
                owner = int(row_owner(torch.tensor([first]), row_offsets)[0])
                hint = (f"id {first} is the first row of rank {owner}'s shard: an id equal to a shard's offset belongs "
                        "to that shard (mind which side torch.searchsorted returns for an equal value)")
            else:
                hint = ("the shards are uneven: each one's rows start at its offset and run up to the next offset, "
                        "so no block size fits them all")
            fail(f"{where}, rank {rank}, which owns {owns}, received ids {result.reshape(-1).tolist()}, expected "
                 f"{want.tolist()}: ids {strangers} are not its own", hint)

        if any(g.numel() != e.numel() for g, e in zip(got, expected)):  # owners worked out another way?
            for rank, (result, want) in enumerate(zip(got, expected)):
                not_its_own(rank, result, want)
        for rank, (result, want) in enumerate(zip(got, expected)):
            result = result.reshape(-1)
            if result.numel() != want.numel():
                fail(
                    f"{where}, rank {rank} returned {result.numel()} ids but owns {want.numel()} of the ids sent",
                    "a receiver cannot guess how many ids arrive: exchange the per-destination counts first "
                    "(all_to_all_single on the counts) and size the output with their sum",
                )
            if not _same_multiset(result, want):
                not_its_own(rank, result, want)
                fail(f"{where}, rank {rank} received ids {result.tolist()}, expected {want.tolist()}",
                     "sort the ids by owner before sending and pass the counts as input_split_sizes")
            if not torch.equal(result, want):
                sorted_note = " (they were sorted)" if torch.equal(result, torch.sort(want).values) else ""
                fail(
                    f"{where}, rank {rank} holds the right ids in the wrong order{sorted_note}: "
                    f"expected {want.tolist()}, got {result.tolist()}",
                    "ids from rank 0 first, then from rank 1, ...; each sender's ids in the order it held them: "
                    "group them by owner with torch.argsort(owner, stable=True), which keeps the order within an owner "
                    "(a plain argsort may not, once a rank holds more than a few ids)",
                )
        for rank, (_, calls, sent) in enumerate(outcomes):
            if not {"all_to_all_single", "all_to_all"} & set(calls):
                fail(
                    f"right ids, but they travelled by {_describe_calls(calls)} on rank {rank}",
                    "use all_to_all_single: each id goes to its owner only, not to every rank",
                )
            held = ids_by_rank[rank].numel()
            if sent > 2 * held + world:  # ids, their counts, and room for one more tensor per id (their positions)
                fail(f"right ids, but {where} rank {rank} handed {sent} values to all-to-all for {held} ids and "
                     f"{world} counts, more than twice its ids: ids (or copies of them) went to ranks that do not own them",
                     "send each id to its owner only: input_split_sizes = how many ids each owner gets")
            if sent < held:
                others = sorted(set(calls) - {"all_to_all_single", "all_to_all"})
                fail(
                    f"right ids, but {where} rank {rank} sent {sent} values by all-to-all and holds {held} ids: "
                    f"the ids themselves travelled by {', '.join(others) or 'another collective'}",
                    "after the counts, send the ids by all_to_all_single too (input_split_sizes=send counts, "
                    "output_split_sizes=received counts): each id goes to its owner only, not to every rank",
                )
    passed("route_ids sends every id to its owner, and only to it, on 2 and 3 ranks and on uneven and empty shards the "
           "lab does not show, counts exchanged, order kept")


def _same_multiset(a: Any, b: Any) -> bool:
    return sorted(a.reshape(-1).tolist()) == sorted(b.reshape(-1).tolist())


# ---------------------------------------------------------------------------------- global_mean


@exercise
def check_global_mean(
    global_mean: Callable[..., Any],
    launch: Callable[..., list[Any]] | None = None,
    timeout: float = _TIMEOUT_S,
) -> None:
    """Run `global_mean(x)` on 2 and 3 ranks (unequal sizes per rank), and on 2 ranks with values the lab does not
    show, and compare with the mean of all values."""
    import torch

    generator = torch.Generator().manual_seed(11)
    fresh = [torch.randint(0, 20, (n,), generator=generator).float() / 4 for n in (5, 9)]
    for world, values in ((2, mean_example(2)), (3, mean_example(3)), (2, fresh)):
        outcomes = _run(global_mean, [(v.clone(),) for v in values], "global_mean", _REPRODUCE_MEAN, launch, timeout)
        total = sum(float(v.sum()) for v in values)
        count = sum(v.numel() for v in values)
        expected = total / count
        got = []
        for rank, (result, _) in enumerate(outcomes):
            try:
                got.append(float(result))
            except (TypeError, ValueError, RuntimeError):
                fail(
                    f"on {world} ranks, rank {rank} returned {result!r}",
                    "return one number: a float, or a one-element tensor",
                )
        wrong = {
            "sum": (total, "that is the sum of all values: divide by the number of values, summed over ranks too"),
            "mean of means": (
                sum(float(v.mean()) for v in values) / world,
                "that is the mean of the ranks' means; the ranks hold different numbers of values, so "
                "weight each by its count: all-reduce the sum and the count together",
            ),
            "sum of means": (
                sum(float(v.mean()) for v in values),
                "that is the sum of the ranks' means: all-reduce the sum and the count, then divide",
            ),
        }
        for rank, value in enumerate(got):
            if _close(value, expected):
                continue
            for _, (bad, hint) in wrong.items():
                if _close(value, bad):
                    fail(f"on {world} ranks, rank {rank} returned {value:.4g}, expected {expected:.4g}", hint)
            if _close(value, float(values[rank].mean())):
                fail(
                    f"on {world} ranks, rank {rank} returned its own mean {value:.4g}, expected {expected:.4g}",
                    "combine across ranks with a collective (dist.all_reduce)",
                )
            hint = "every rank must get the same answer: only a collective's result is the same on every rank"
            if len(set(round(v, 9) for v in got)) == 1:
                hint = "compute the sum of all values and their number across all ranks, then divide"
            fail(f"on {world} ranks, rank {rank} returned {value:.4g}, expected {expected:.4g}", hint)
        for rank, (_, calls) in enumerate(outcomes):
            if len(calls) != 1:
                fail(
                    f"right answer, but rank {rank} ran {len(calls)} collectives ({_describe_calls(calls)}), not one",
                    "put the sum and the count in one tensor, torch.stack([x.sum(), count]), and all-reduce it once",
                )
            if "gather" in calls[0] or calls[0] in ("all_to_all", "all_to_all_single"):
                fail(
                    f"right answer, but rank {rank} used {calls[0]}: every rank received what every rank sent and "
                    "combined it itself, p times the data of a collective that combines the contributions on the way",
                    "two numbers per rank are enough: all-reduce torch.stack([x.sum(), count]) and divide",
                )
            if calls[0] != "all_reduce":
                fail(
                    f"right answer, but rank {rank} used {calls[0]}: a copy of the pair for every rank, or a result "
                    "that lands on one rank, where all_reduce leaves the combined pair on every rank in one call",
                    "two numbers per rank are enough: all-reduce torch.stack([x.sum(), count]) and divide",
                )
    passed("global_mean gives every rank the mean of all values on 2 and 3 ranks and on values the lab does not show, "
           "with one collective")


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-6)


# ----------------------------------------------------------------------------- my_slice_of_sum

_REPRODUCE_SLICE = "xs = lab01.slice_example(2); launch(lambda: my_slice_of_sum(xs[dist.get_rank()]))"
# Collectives that leave rank r with slice r of the sum and nothing more: a reduce-scatter, or an all-to-all of
# the slices followed by a local sum (a reduce-scatter written by hand).
_SLICE_COLLECTIVES = {"reduce_scatter", "reduce_scatter_single", "reduce_scatter_tensor", "all_to_all", "all_to_all_single"}


def slice_example(world_size: int = 2, length: int | None = None, seed: int = 0) -> list[Any]:
    """The tensor each rank holds in the slice-of-a-sum exercise: integer-valued floats (sums are exact)."""
    import torch

    length = length if length is not None else {2: 12, 3: 10}.get(world_size, 4 * world_size)
    generator = torch.Generator().manual_seed(seed + 100 * world_size + length)
    return [torch.randint(-9, 10, (length,), generator=generator).float() for _ in range(world_size)]


def _slice_on_rank(fn: Callable[..., Any], xs: list[Any]) -> tuple[Any, list[str], int]:
    """On each rank: fn(xs[rank]) with its collectives counted, and how many values it handed to them to send."""
    import torch.distributed as dist

    dist.barrier()
    sent = []
    result, calls = _call_counting(fn, [(x,) for x in xs], lambda name, args, kwargs: sent.append(_all_to_all_elements(name, args, kwargs)))
    return result, calls, sum(sent)


@exercise
def check_slice_of_sum(
    my_slice_of_sum: Callable[..., Any],
    launch: Callable[..., list[Any]] | None = None,
    timeout: float = _TIMEOUT_S,
) -> None:
    """Run `my_slice_of_sum(x)` on 2 and 3 ranks (lengths that do not divide evenly on 3), and on 2 ranks with 7
    values the lab does not show, and compare every
    rank's answer with slice r of the sum (``torch.tensor_split(sum, world_size)[r]``); then judge the
    collective it chose: one that leaves each rank its slice only (reduce-scatter, or all-to-all + local sum),
    handed no more values than the rank's tensor holds (padded to equal slices at most), and a result of x's dtype."""
    import torch

    from course_lib.launcher.launch import LaunchError

    if launch is None:
        from course_lib import launch
    runs = []
    # the lab's two examples, then 7 values on 2 ranks (slices of 4 and 3) the lab does not show: slice sizes
    # typed in for the lab's lengths (6 + 6, 4 + 3 + 3), or its sums looked up, fit the lab's examples only
    fresh = slice_example(2, length=7, seed=1)
    for world, xs in ((2, slice_example(2)), (3, slice_example(3)), (2, fresh)):
        on = f"on {world} ranks" + (f" with {xs[0].numel()} values the lab does not show" if xs is fresh else "")
        total = torch.stack(xs).sum(0)
        expected = list(torch.tensor_split(total, world))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                outcomes = launch(_slice_on_rank, my_slice_of_sum, xs, world_size=world, show_ranks=[], timeout=timeout)
        except LaunchError as error:
            raised = [f for f in error.failures if f.kind == "raised"]
            if raised and all(f.exc_type == "NotImplementedError" and not f.message.strip() for f in raised):
                raise
            _fail_if_input_changed(error, world)
            first = error.failures[0].headline() if error.failures else error.summary
            hint = _launch_hint(str(error), _REPRODUCE_SLICE)
            if "invalid tensor size" in first.lower():
                hint = (
                    f"{xs[0].numel()} values do not split evenly over {world} ranks, and this collective wants equal "
                    "tensors on gloo: dist.reduce_scatter(out, list(torch.tensor_split(x, world_size))) takes uneven "
                    "slices, and so does all_to_all_single with input_split_sizes and output_split_sizes"
                )
            elif "divide" in str(error) or "size" in first.lower():
                hint = (
                    f"{xs[0].numel()} values do not split evenly over {world} ranks: reduce_scatter_single needs equal "
                    "slices; the list form dist.reduce_scatter(out, list(torch.tensor_split(x, world_size))) does not"
                )
            if xs is fresh:  # the lab's own lengths went through
                hint = ("it ran on the lab's examples (12 values on 2 ranks, 10 on 3) but not on 7: work the slice sizes "
                        "out from x, torch.tensor_split(x, world_size), not from the lab's lengths")
            fail(f"my_slice_of_sum failed {on}: {first}", hint)
        for rank, (result, calls, _) in enumerate(outcomes):
            want = expected[rank]
            if not isinstance(result, torch.Tensor):
                fail(f"{on}, rank {rank} returned a {type(result).__name__}", "return a tensor: this rank's slice of the sum")
            if result.dtype != xs[rank].dtype:
                fail(f"{on}, rank {rank} returned {result.dtype} values from a {xs[rank].dtype} tensor",
                     "keep the dtype of x: the sum of float values is a float tensor (no .long(), .int() or .double())")
            result = result.detach().reshape(-1).float()
            if result.numel() == total.numel() and torch.allclose(result, total):
                fail(
                    f"{on}, rank {rank} returned the whole sum ({total.numel()} values)",
                    f"rank r keeps only slice r of it: torch.tensor_split(sum, world_size)[r], here {want.numel()} values",
                )
            if result.numel() != want.numel():
                chunked = [c.numel() for c in torch.chunk(total, world)]
                hint = f"slice r is torch.tensor_split(x, world_size)[r]: sizes {[e.numel() for e in expected]}"
                if [c for c in chunked] != [e.numel() for e in expected]:
                    hint += f" (torch.chunk gives {chunked})"
                fail(f"{on}, rank {rank} returned {result.numel()} values, its slice has {want.numel()}", hint)
            if torch.allclose(result, want):
                continue
            own = torch.tensor_split(xs[rank], world)[rank]
            if torch.allclose(result, own):
                fail(
                    f"{on}, rank {rank} returned its own slice of its own tensor",
                    "the sum needs every rank's values: a collective must bring them in",
                )
            if torch.allclose(result * world, want):
                fail(f"{on}, rank {rank} returned the mean, not the sum", "sum over ranks (ReduceOp.SUM, the default)")
            for other in range(world):
                if other != rank and expected[other].numel() == want.numel() and torch.allclose(result, expected[other]):
                    fail(
                        f"{on}, rank {rank} returned slice {other} of the sum",
                        f"rank r keeps slice r; in an all-to-all, chunk j of the input goes to rank j",
                    )
            fail(f"{on}, rank {rank} returned {result.tolist()}, expected {want.tolist()}", "slice r of the sum over all ranks")
        runs.append((xs, outcomes))
    for xs, outcomes in runs:  # the values first, on every run; then the collective chosen
        for rank, (_, calls, sent) in enumerate(outcomes):
            chosen = set(calls)
            if not chosen:
                fail(f"right values, but rank {rank} ran no collective", "the other ranks' values must travel")
            if "all_reduce" in chosen:
                fail(
                    "right values, but by all_reduce: every rank received the whole sum and threw most of it away",
                    "a reduce-scatter leaves each rank its slice only: (p-1)/p N per rank on a ring instead of 2(p-1)/p N",
                )
            gathers = chosen & {"all_gather", "all_gather_single", "all_gather_into_tensor", "all_gather_object", "gather", "gather_object"}
            if gathers:
                fail(
                    f"right values, but by {sorted(gathers)[0]}: every rank received every rank's whole tensor ((p-1) N)",
                    "only slice r of each tensor is needed on rank r: reduce_scatter, or all_to_all of the slices",
                )
            n = xs[rank].numel()
            if chosen <= _SLICE_COLLECTIVES and sent > len(outcomes) * math.ceil(n / len(outcomes)):  # padding allowed
                fail(f"right values, but rank {rank} handed {sent} values to {_describe_calls(calls)} for a tensor of {n}: "
                     "every rank was sent whole tensors, not only its slice",
                     "send slice j of x to rank j only: reduce_scatter(out, list(torch.tensor_split(x, p))), or all_to_all_single with split sizes")
            if not chosen <= _SLICE_COLLECTIVES:
                fail(
                    f"right values, but rank {rank} ran {_describe_calls(calls)}",
                    "one collective leaves each rank its slice of the sum: reduce_scatter (or all_to_all, then sum)",
                )
    used = ", ".join(sorted({c for _, outcomes in runs for _, calls, _ in outcomes for c in calls}))
    passed(f"my_slice_of_sum gives rank r slice r of the sum on 2 and 3 ranks (uneven slices on 3, and on 2 ranks with "
           f"7 values the lab does not show), by {used}, each "
           "rank handing its collective no more values than its tensor holds (padding aside)")
