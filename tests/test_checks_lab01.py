"""The 01_collectives checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import math
import re
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from course_lib.checks import CheckFailed
from course_lib.checks import lab01

from conftest import rejects

# Ship this module's functions to the ranks by value, as a notebook's are: otherwise every rank of every
# launch imports this test module, and pytest with it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------ the data


def test_examples_are_built_so_that_the_shortcuts_give_wrong_answers():
    for world in (2, 3):
        ids_by_rank, row_offsets, num_rows = lab01.route_example(world)
        routed = lab01._expected_routing(ids_by_rank, row_offsets)
        # a receiver that guesses "as many as I send" is wrong on some rank
        assert [len(r) for r in routed] != [len(i) for i in ids_by_rank]
        assert sorted(torch.cat(routed).tolist()) == sorted(torch.cat(ids_by_rank).tolist())
        assert set(row_offsets[1:]) & set(torch.cat(ids_by_rank).tolist())  # ids on a shard's first row
        values = lab01.mean_example(world)
        assert len({v.numel() for v in values}) > 1  # unequal counts: mean of means is not the mean
        mean = float(torch.cat(values).mean())
        assert not math.isclose(mean, sum(float(v.mean()) for v in values) / world)
    ids_by_rank, row_offsets, num_rows = lab01.route_example(3)
    assert lab01._expected_routing(ids_by_rank, row_offsets)[2].tolist() == [9, 8, 8, 9]  # TorchRec's 4, 4, 2 rows


def test_the_unseen_cases_hold_empty_shards_boundaries_and_a_rank_an_unstable_sort_reorders():
    (middle, middle_offsets, _), (last, last_offsets, rows) = lab01.unseen_route_cases()
    assert middle_offsets[1] == middle_offsets[2] and 6 in torch.cat(middle).tolist()
    assert last_offsets[-1] == rows  # the last shard is empty
    owner = lab01.row_owner(last[0], last_offsets)
    assert not torch.equal(torch.argsort(owner), torch.argsort(owner, stable=True))  # on this torch's CPU sort


# ---------------------------------------------------------------------------------- route_ids


def owner_of(ids, row_offsets):
    return torch.searchsorted(torch.tensor(row_offsets), ids, right=True) - 1


def _send_to_owners(ids, owner, stable=True):
    """The all-to-all of the solution, for any rule that names each id's owner: counts first, then the ids."""
    world = dist.get_world_size()
    send = ids[torch.argsort(owner, stable=True) if stable else torch.argsort(owner)]
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    received = torch.empty(int(recv_counts.sum()), dtype=ids.dtype)
    dist.all_to_all_single(received, send, recv_counts.tolist(), send_counts.tolist())
    return received


def route_solution(ids, row_offsets):
    return _send_to_owners(ids, owner_of(ids, row_offsets))


def route_by_bucketize(ids, row_offsets):  # another right answer: the offsets after rank 0's, right=True
    return _send_to_owners(ids, torch.bucketize(ids, torch.tensor(row_offsets[1:]), right=True))


def route_by_comparison(ids, row_offsets):  # another right answer: how many offsets after rank 0's are <= id
    return _send_to_owners(ids, (ids[:, None] >= torch.tensor(row_offsets[1:])[None, :]).sum(1))


def route_modulo(ids, row_offsets):
    return _send_to_owners(ids, ids % dist.get_world_size())


def route_by_first_block(ids, row_offsets):  # the even formula, with rank 0's shard as the block
    return _send_to_owners(ids, ids // row_offsets[1])


def route_by_first_block_clamped(ids, row_offsets):  # the same, kept in range: right for even shards only
    return _send_to_owners(ids, torch.clamp(ids // row_offsets[1], max=dist.get_world_size() - 1))


def route_rows_from_the_ids(ids, row_offsets):  # the even formula, the table's size read off the largest id anywhere
    top = ids.max().reshape(1) if ids.numel() else torch.zeros(1, dtype=ids.dtype)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    return _send_to_owners(ids, ids // math.ceil((int(top) + 1) / dist.get_world_size()))


def route_left_of_the_boundary(ids, row_offsets):  # right=False: an id on a shard's first row goes to the rank before
    return _send_to_owners(ids, torch.searchsorted(torch.tensor(row_offsets[1:]), ids))


def route_left_minus_one(ids, row_offsets):  # right=False on all offsets: id 0 gets owner -1
    return _send_to_owners(ids, torch.searchsorted(torch.tensor(row_offsets), ids) - 1)


def route_first_equal_offset(ids, row_offsets):  # an id equal to an offset goes to the first rank with that offset
    offsets = torch.tensor(row_offsets)
    at = torch.searchsorted(offsets, ids)
    hit = (at < len(row_offsets)) & (offsets[at.clamp(max=len(row_offsets) - 1)] == ids)
    return _send_to_owners(ids, torch.where(hit, at, at - 1))


def route_unstable(ids, row_offsets):  # argsort without stable=True
    return _send_to_owners(ids, owner_of(ids, row_offsets), stable=False)


def route_typed_in_offsets(ids, row_offsets):  # the lab's offsets, whatever the argument
    return route_solution(ids, {2: [0, 3], 3: [0, 4, 8]}[dist.get_world_size()])


def route_without_counts(ids, row_offsets):
    world = dist.get_world_size()
    owner = owner_of(ids, row_offsets)
    send = ids[torch.argsort(owner, stable=True)]
    send_counts = torch.bincount(owner, minlength=world)
    received = torch.empty_like(send)  # guesses: as many as I send
    dist.all_to_all_single(received, send, input_split_sizes=send_counts.tolist())
    return received


def route_sorted(ids, row_offsets):
    return torch.sort(route_solution(ids, row_offsets)).values


def route_by_sorting_the_ids(ids, row_offsets):  # sorted ids are grouped by owner too, but lose the sender's order
    owner = owner_of(ids, row_offsets)
    return _send_to_owners(torch.sort(ids).values, torch.sort(owner).values)


def route_by_all_gather(ids, row_offsets):
    world = dist.get_world_size()
    parts = [None] * world
    dist.all_gather_object(parts, ids)
    return torch.cat([p[owner_of(p, row_offsets) == dist.get_rank()] for p in parts])


def route_with_own_counts(ids, row_offsets):  # assumes it receives what it sends: gloo aborts the process
    world = dist.get_world_size()
    owner = owner_of(ids, row_offsets)
    send = ids[torch.argsort(owner, stable=True)]
    counts = torch.bincount(owner, minlength=world).tolist()
    received = torch.empty(len(ids), dtype=ids.dtype)
    dist.all_to_all_single(received, send, counts, counts)
    return received


def route_on_rank_0_only(ids, row_offsets):
    if dist.get_rank() == 0:
        return route_solution(ids, row_offsets)
    return ids


def route_with_a_typo(ids, row_offsets):
    return route_solution(ids, row_offset)  # noqa: F821


def route_as_float(ids, row_offsets):
    return route_solution(ids, row_offsets).float()


def route_unwritten(ids, row_offsets):
    raise NotImplementedError()


def test_route_check_accepts_the_solution(capsys):
    lab01.check_route_ids(route_solution)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize("right", [route_by_bucketize, route_by_comparison])
def test_route_check_accepts_other_ways_to_find_the_owner(right, capsys):
    lab01.check_route_ids(right)
    assert capsys.readouterr().out.startswith("✓")


UNSEEN_MIDDLE = "on 3 ranks with row_offsets [0, 6, 6] (not in the lab)"
UNSEEN_LAST = "on 3 ranks with row_offsets [0, 2, 9] (not in the lab)"


@pytest.mark.parametrize(
    "wrong, words",
    [
        (route_modulo, r"id % 2"),
        # owners up to 3 on 2 ranks: one rank's counts tensor is longer, and gloo says so or aborts the other rank
        (route_by_first_block, r"failed on 2 ranks(.|\n)*(the last rank owns every row from its offset|disagreed about how many)"),
        (route_by_first_block_clamped, re.escape(f"{UNSEEN_MIDDLE}, rank 1, which owns no rows") + r"(.|\n)*shard is empty"),
        (route_rows_from_the_ids, r"on 2 ranks with row_offsets \[0, 3\], rank 0, which owns rows \[0, 3\)(.|\n)*no block size fits"),
        (route_left_of_the_boundary, r"rank 0, which owns rows \[0, 3\)(.|\n)*id 3 is the first row of rank 1's shard"),
        (route_left_minus_one, r"owner came out negative(.|\n)*`right` argument"),
        (route_first_equal_offset, re.escape(f"{UNSEEN_MIDDLE}, rank 1, which owns no rows, received ids [6, 6, 6]")),
        (route_unstable, re.escape(f"{UNSEEN_LAST}, rank 0 holds the right ids in the wrong order") + r"(.|\n)*stable=True"),
        (route_typed_in_offsets, re.escape(UNSEEN_MIDDLE)),
        (route_without_counts, r"exchange the counts first"),
        (route_sorted, r"wrong order \(they were sorted\)"),
        (route_by_sorting_the_ids, r"wrong order"),
        (route_by_all_gather, r"travelled by all_gather_object"),
        (route_as_float, r"dtype=ids.dtype"),
        (route_unwritten, r"not written yet"),
        (route_with_own_counts, r"disagreed about how many values travel"),
        (route_on_rank_0_only, r"same collectives in the same order"),
        (route_with_a_typo, r"NameError(.|\n)*run it yourself"),
    ],
)
def test_route_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab01.check_route_ids(wrong)


def test_route_check_names_the_wrong_order_within_a_sender():
    def reversed_within_sender(ids, row_offsets):
        return route_solution(ids.flip(0), row_offsets)

    with pytest.raises(CheckFailed, match="wrong order") as info:
        lab01.check_route_ids(reversed_within_sender)
    assert "stable=True" in info.value.hint


def test_route_check_catches_a_wrong_output_size_that_does_not_crash():
    def truncated(ids, row_offsets):  # right ids, but only as many as this rank sent
        return route_solution(ids, row_offsets)[: len(ids)]

    with pytest.raises(CheckFailed, match="rank 1 returned 3 ids but owns 7"):
        lab01.check_route_ids(truncated)


def route_appending_the_table_end(ids, row_offsets):  # "closes" the offsets with the table's end: the caller's list grows
    row_offsets.append(10**9)
    return _send_to_owners(ids, torch.searchsorted(torch.tensor(row_offsets), ids, right=True) - 1)


def test_route_check_rejects_an_answer_that_changes_the_offsets():
    rejects(lab01.check_route_ids, route_appending_the_table_end, match="changed its argument 2 (a list) in place")


# -------------------------------------------------------------------------------- global_mean


def mean_solution(x):
    t = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def mean_sum_only(x):
    t = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
    dist.all_reduce(t)
    return t[0].item()


def mean_of_means(x):
    m = x.mean()
    dist.all_reduce(m)
    return m.item() / dist.get_world_size()


def mean_local(x):
    return x.mean().item()


def mean_two_collectives(x):
    s, n = x.sum(), torch.tensor(float(x.numel()))
    dist.all_reduce(s)
    dist.all_reduce(n)
    return (s / n).item()


def mean_assumes_equal_counts(x):
    s = x.sum()
    dist.all_reduce(s)
    return (s / (x.numel() * dist.get_world_size())).item()


def test_mean_check_accepts_the_solution(capsys):
    lab01.check_global_mean(mean_solution)
    assert capsys.readouterr().out.startswith("✓")


def test_mean_check_accepts_a_one_element_tensor(capsys):
    def as_tensor(x):
        t = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
        dist.all_reduce(t)
        return t[0] / t[1]

    lab01.check_global_mean(as_tensor)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (mean_sum_only, r"sum of all values: divide"),
        (mean_of_means, r"mean of the ranks' means"),
        (mean_local, r"its own mean"),
        (mean_two_collectives, r"2 collectives \(all_reduce, all_reduce\)"),
        (mean_assumes_equal_counts, r"every rank must get the same answer"),
    ],
)
def test_mean_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab01.check_global_mean(wrong)


def mean_by_gathering_pairs(x):  # one collective, two numbers a rank, but every rank adds up everyone's pairs
    pairs = torch.empty(2 * dist.get_world_size())
    dist.all_gather_into_tensor(pairs, torch.stack([x.sum(), torch.tensor(float(x.numel()))]))
    total = pairs.view(-1, 2).sum(0)
    return (total[0] / total[1]).item()


def mean_by_gathering_values(x):
    everything = [None] * dist.get_world_size()
    dist.all_gather_object(everything, x.tolist())
    values = [v for part in everything for v in part]
    return sum(values) / len(values)


def mean_reduced_to_rank_0(x):
    t = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
    dist.reduce(t, dst=0)
    return (t[0] / t[1]).item()


def mean_returns_the_pair(x):
    t = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
    dist.all_reduce(t)
    return t


@pytest.mark.parametrize(
    "wrong, words",
    [
        (mean_by_gathering_values, r"used all_gather_object: every rank received what every rank sent and combined it itself"),
        (mean_by_gathering_pairs, r"used all_gather_into_tensor: every rank received what every rank sent and combined it itself"),
        (mean_reduced_to_rank_0, r"rank 1 returned"),
        (mean_returns_the_pair, r"return one number"),
    ],
)
def test_mean_check_rejects_more_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab01.check_global_mean(wrong)


# ---------------------------------------------------------------------------- my_slice_of_sum


def slice_by_reduce_scatter(x):
    p, r = dist.get_world_size(), dist.get_rank()
    pieces = list(torch.tensor_split(x, p))
    out = torch.empty_like(pieces[r])
    dist.reduce_scatter(out, pieces)
    return out


def slice_by_all_to_all(x):
    p, r = dist.get_world_size(), dist.get_rank()
    sizes = [piece.numel() for piece in torch.tensor_split(x, p)]
    received = torch.empty(p * sizes[r])
    dist.all_to_all_single(received, x, [sizes[r]] * p, sizes)
    return received.view(p, sizes[r]).sum(0)


def slice_by_list_all_to_all(x):  # gloo's list form wants equal tensors: fails on 3 ranks, 10 values
    p, r = dist.get_world_size(), dist.get_rank()
    pieces = [piece.contiguous() for piece in torch.tensor_split(x, p)]
    received = [torch.empty_like(pieces[r]) for _ in range(p)]
    dist.all_to_all(received, pieces)
    return torch.stack(received).sum(0)


def slice_by_all_reduce(x):
    total = x.clone()
    dist.all_reduce(total)
    return torch.tensor_split(total, dist.get_world_size())[dist.get_rank()]


def slice_by_all_gather(x):
    gathered = [torch.empty_like(x) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, x)
    return torch.tensor_split(torch.stack(gathered).sum(0), dist.get_world_size())[dist.get_rank()]


def slice_without_communication(x):
    return torch.tensor_split(x, dist.get_world_size())[dist.get_rank()]


def slice_the_whole_sum(x):
    total = x.clone()
    dist.all_reduce(total)
    return total


def slice_by_chunk(x):
    p, r = dist.get_world_size(), dist.get_rank()
    total = x.clone()
    dist.all_reduce(total)
    pieces = torch.chunk(total, p)
    return pieces[r] if r < len(pieces) else total[:0]


def slice_of_the_next_rank(x):
    p, r = dist.get_world_size(), dist.get_rank()
    pieces = list(torch.tensor_split(x, p))
    out = torch.empty_like(pieces[r])
    dist.reduce_scatter(out, pieces[1:] + pieces[:1])  # every slice sent one rank too far
    return out


def slice_averaged(x):
    return slice_by_reduce_scatter(x) / dist.get_world_size()


def slice_single_assumes_even(x):
    p = dist.get_world_size()
    out = torch.empty(x.numel() // p)
    dist.reduce_scatter_single(out, x)
    return out


def slice_via_rank_0(x):  # funnels the whole sum through rank 0; gloo's scatter then wants equal slices
    p, r = dist.get_world_size(), dist.get_rank()
    total = x.clone()
    dist.reduce(total, dst=0)
    out = torch.empty_like(torch.tensor_split(x, p)[r])
    dist.scatter(out, [piece.contiguous() for piece in torch.tensor_split(total, p)] if r == 0 else None, src=0)
    return out


def test_slice_check_accepts_reduce_scatter_and_all_to_all(capsys):
    lab01.check_slice_of_sum(slice_by_reduce_scatter)
    assert capsys.readouterr().out.startswith("✓")
    lab01.check_slice_of_sum(slice_by_all_to_all)
    assert "all_to_all" in capsys.readouterr().out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (slice_by_all_reduce, r"by all_reduce: every rank received the whole sum"),
        (slice_by_all_gather, r"by all_gather: every rank received every rank's whole tensor"),
        (slice_without_communication, r"its own slice of its own tensor"),
        (slice_the_whole_sum, r"returned the whole sum"),
        (slice_by_chunk, r"torch.chunk gives \[4, 4, 2\]"),
        (slice_of_the_next_rank, r"returned slice 1 of the sum"),
        (slice_averaged, r"the mean, not the sum"),
        (slice_single_assumes_even, r"failed on 3 ranks(.|\n)*tensor_split"),
        (slice_by_list_all_to_all, r"failed on 3 ranks(.|\n)*all_to_all_single"),
        (slice_via_rank_0, r"failed on 3 ranks(.|\n)*wants equal"),
        (lambda x: x.tolist(), r"returned a list"),
    ],
)
def test_slice_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab01.check_slice_of_sum(wrong)


# ------------------------------------------------------------------ more wrong answers (adversarial review)


def route_counts_then_gather_everything(ids, row_offsets):  # counts by all-to-all, then every id to every rank
    world = dist.get_world_size()
    send_counts = torch.bincount(owner_of(ids, row_offsets), minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    parts = [None] * world
    dist.all_gather_object(parts, ids.tolist())
    mine = [i for part in parts for i in part]
    return torch.tensor([i for i, o in zip(mine, owner_of(torch.tensor(mine), row_offsets).tolist()) if o == dist.get_rank()],
                        dtype=ids.dtype)


def route_counts_by_all_gather(ids, row_offsets):  # another right answer: the counts by all_gather, the ids by all-to-all
    world, rank = dist.get_world_size(), dist.get_rank()
    owner = owner_of(ids, row_offsets)
    send = ids[torch.argsort(owner, stable=True)]
    send_counts = torch.bincount(owner, minlength=world)
    every = [torch.empty_like(send_counts) for _ in range(world)]
    dist.all_gather(every, send_counts)
    recv_counts = [int(counts[rank]) for counts in every]
    received = torch.empty(sum(recv_counts), dtype=ids.dtype)
    dist.all_to_all_single(received, send, recv_counts, send_counts.tolist())
    return received


@pytest.mark.parametrize(
    "wrong, words",
    [
        (route_counts_then_gather_everything, "the ids themselves travelled by all_gather_object"),
    ],
)
def test_route_check_rejects_more_wrong_answers(wrong, words):
    rejects(lab01.check_route_ids, wrong, match=words)


def test_route_check_accepts_counts_exchanged_by_all_gather(capsys):
    lab01.check_route_ids(route_counts_by_all_gather)
    assert capsys.readouterr().out.startswith("✓")


# ------------------------------------------------------------------ answers that change what they were handed


def route_sorting_the_callers_ids(ids, row_offsets):  # right ids arrive, but the caller's ids are now reordered
    order = torch.argsort(owner_of(ids, row_offsets), stable=True)
    ids[:] = ids[order].clone()
    return route_solution(ids, row_offsets)


def mean_casting_the_callers_tensor(x):  # "more precision": the caller's tensor is now float64
    x.data = x.data.double()
    t = torch.stack([x.sum(), torch.tensor(float(x.numel()), dtype=torch.float64)])
    dist.all_reduce(t)
    return (t[0] / t[1]).item()


def slice_reducing_the_callers_tensor(x):  # all_reduce works in place: the caller's x now holds the sum
    dist.all_reduce(x)
    return torch.tensor_split(x, dist.get_world_size())[dist.get_rank()]


@pytest.mark.parametrize(
    "check, wrong",
    [
        (lab01.check_route_ids, route_sorting_the_callers_ids),
        (lab01.check_global_mean, mean_casting_the_callers_tensor),
        (lab01.check_slice_of_sum, slice_reducing_the_callers_tensor),
    ],
)
def test_answers_that_change_their_input_are_rejected(check, wrong):
    with pytest.raises(CheckFailed, match=r"changed its argument 1 \(a torch\.\w+ tensor of shape .*\) in place") as failure:
        check(wrong)
    assert "work on a copy" in failure.value.hint


# ------------------------------------------------------------------ more wrong answers (a second adversarial review)


def route_everything_then_filter(ids, row_offsets):  # every id to every rank by all-to-all, each keeps its own
    world, rank = dist.get_world_size(), dist.get_rank()
    counts = torch.full((world,), ids.numel(), dtype=torch.int64)
    received_counts = torch.empty_like(counts)
    dist.all_to_all_single(received_counts, counts)
    received = torch.empty(int(received_counts.sum()), dtype=ids.dtype)
    dist.all_to_all_single(received, ids.repeat(world), received_counts.tolist(), counts.tolist())
    return received[owner_of(received, row_offsets) == rank]


def route_as_int32(ids, row_offsets):
    return route_solution(ids, row_offsets).to(torch.int32)


def mean_typed_in(x):  # the lab prints every rank's values: the two means worked out by hand
    dist.all_reduce(torch.zeros(1))
    return {2: 14 / 8, 3: 32 / 11}[dist.get_world_size()]


def slice_by_all_to_all_of_whole_tensors(x):  # "send my x to everyone, sum what arrives, keep my slice"
    p, r = dist.get_world_size(), dist.get_rank()
    received = torch.empty(p * x.numel(), dtype=x.dtype)
    dist.all_to_all_single(received, x.repeat(p))
    return torch.tensor_split(received.reshape(p, -1).sum(0), p)[r]


def slice_by_reduce_scatter_of_whole_copies(x):  # an all-reduce in disguise, then the slice
    p = dist.get_world_size()
    out = torch.empty_like(x)
    dist.reduce_scatter(out, [x.clone() for _ in range(p)])
    return torch.tensor_split(out, p)[dist.get_rank()]


def slice_as_long(x):
    return slice_by_reduce_scatter(x).long()


@pytest.mark.parametrize(
    "check, wrong, words",
    [
        (lab01.check_route_ids, route_everything_then_filter, "went to ranks that do not own them"),
        (lab01.check_route_ids, route_as_int32, "torch.int32 ids"),
        (lab01.check_global_mean, mean_typed_in, "on 2 ranks, rank 0 returned 1.75"),
        (lab01.check_slice_of_sum, slice_by_all_to_all_of_whole_tensors, "every rank was sent whole tensors"),
        (lab01.check_slice_of_sum, slice_by_reduce_scatter_of_whole_copies, "every rank was sent whole tensors"),
        (lab01.check_slice_of_sum, slice_as_long, "torch.int64 values from a torch.float32 tensor"),
    ],
)
def test_checks_reject_answers_right_only_on_the_labs_examples_or_at_a_hidden_cost(check, wrong, words):
    rejects(check, wrong, match=words)


def slice_by_padded_reduce_scatter(x):  # FSDP's way: pad every slice to the largest, reduce-scatter, trim
    p, r = dist.get_world_size(), dist.get_rank()
    slices = torch.tensor_split(x, p)
    width = max(s.numel() for s in slices)
    padded = torch.cat([torch.nn.functional.pad(s, (0, width - s.numel())) for s in slices])
    out = torch.empty(width, dtype=x.dtype)
    dist.reduce_scatter_tensor(out, padded)
    return out[: slices[r].numel()]


def route_with_positions(ids, row_offsets):  # right, if wasteful: each id's position travels beside it
    world = dist.get_world_size()
    owner = owner_of(ids, row_offsets)
    order = torch.argsort(owner, stable=True)
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    received = torch.empty(int(recv_counts.sum()), dtype=ids.dtype)
    dist.all_to_all_single(received, ids[order], recv_counts.tolist(), send_counts.tolist())
    positions = torch.empty_like(received)
    dist.all_to_all_single(positions, order, recv_counts.tolist(), send_counts.tolist())
    return received


@pytest.mark.parametrize(
    "check, right",
    [(lab01.check_slice_of_sum, slice_by_padded_reduce_scatter), (lab01.check_route_ids, route_with_positions)],
)
def test_checks_accept_right_answers_that_send_a_little_more(check, right, capsys):
    check(right)
    assert capsys.readouterr().out.startswith("✓")


def mean_by_reduce_scatter(x):  # combines on the way, but hands over a copy of the pair for every rank
    p = dist.get_world_size()
    pair = torch.stack([x.sum(), torch.tensor(float(x.numel()))])
    out = torch.empty(2)
    dist.reduce_scatter(out, [pair.clone() for _ in range(p)])
    return out[0] / out[1]


def test_mean_check_names_what_reduce_scatter_did():
    rejects(lab01.check_global_mean, mean_by_reduce_scatter, match="a copy of the pair for every rank")


def slice_sizes_typed_in(x):  # the lab's two lengths (12 on 2 ranks, 10 on 3) typed in as slice sizes
    p, r = dist.get_world_size(), dist.get_rank()
    sizes = {2: [6, 6], 3: [4, 3, 3]}[p]
    out = torch.empty(sizes[r], dtype=x.dtype)
    dist.reduce_scatter(out, list(torch.split(x, sizes)))
    return out


def slice_of_the_labs_data(x):  # the sum worked out locally from the lab's data; the reduce-scatter only for show
    p, r = dist.get_world_size(), dist.get_rank()
    slices = list(torch.tensor_split(x, p))
    dist.reduce_scatter(torch.empty_like(slices[r]), slices)
    return torch.tensor_split(torch.stack(lab01.slice_example(p)).sum(0), p)[r]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (slice_sizes_typed_in, "(?s)failed on 2 ranks with 7 values the lab does not show: .*work the slice sizes out from x"),
        (slice_of_the_labs_data, "on 2 ranks with 7 values the lab does not show, rank 0 returned 6 values, its slice has 4"),
    ],
)
def test_slice_check_runs_on_values_the_lab_does_not_show(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab01.check_slice_of_sum(wrong)
