"""The 01_collectives checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import math
import sys

import cloudpickle
import pytest
import torch
import torch.distributed as dist

from course_lib.checks import CheckFailed
from course_lib.checks import lab01

# Ship this module's functions to the ranks by value, as a notebook's are: otherwise every rank of every
# launch imports this test module, and pytest with it.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


# ------------------------------------------------------------------------------------ the data


def test_examples_are_built_so_that_the_shortcuts_give_wrong_answers():
    for world in (2, 3):
        ids_by_rank, num_rows = lab01.route_example(world)
        routed = lab01._expected_routing(ids_by_rank, num_rows)
        # a receiver that guesses "as many as I send" is wrong on some rank
        assert [len(r) for r in routed] != [len(i) for i in ids_by_rank]
        assert sorted(torch.cat(routed).tolist()) == sorted(torch.cat(ids_by_rank).tolist())
        values = lab01.mean_example(world)
        assert len({v.numel() for v in values}) > 1  # unequal counts: mean of means is not the mean
        mean = float(torch.cat(values).mean())
        assert not math.isclose(mean, sum(float(v.mean()) for v in values) / world)
    ids_by_rank, num_rows = lab01.route_example(3)
    assert lab01._expected_routing(ids_by_rank, num_rows)[2].tolist() == [9, 8, 8, 9]  # ceil(10/3) = 4 rows a block


# ---------------------------------------------------------------------------------- route_ids


def route_solution(ids, num_rows):
    world = dist.get_world_size()
    owner = ids // math.ceil(num_rows / world)
    send = ids[torch.argsort(owner, stable=True)]
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    received = torch.empty(int(recv_counts.sum()), dtype=ids.dtype)
    dist.all_to_all_single(received, send, recv_counts.tolist(), send_counts.tolist())
    return received


def route_modulo(ids, num_rows):
    world = dist.get_world_size()
    owner = ids % world
    send = ids[torch.argsort(owner, stable=True)]
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts)
    received = torch.empty(int(recv_counts.sum()), dtype=ids.dtype)
    dist.all_to_all_single(received, send, recv_counts.tolist(), send_counts.tolist())
    return received


def route_without_counts(ids, num_rows):
    world = dist.get_world_size()
    owner = ids // math.ceil(num_rows / world)
    send = ids[torch.argsort(owner, stable=True)]
    send_counts = torch.bincount(owner, minlength=world)
    received = torch.empty_like(send)  # guesses: as many as I send
    dist.all_to_all_single(received, send, input_split_sizes=send_counts.tolist())
    return received


def route_sorted(ids, num_rows):
    return torch.sort(route_solution(ids, num_rows)).values


def route_by_all_gather(ids, num_rows):
    world = dist.get_world_size()
    parts = [None] * world
    dist.all_gather_object(parts, ids)
    block = math.ceil(num_rows / world)
    return torch.cat([p[p // block == dist.get_rank()] for p in parts])


def route_with_own_counts(ids, num_rows):  # assumes it receives what it sends: gloo aborts the process
    world = dist.get_world_size()
    owner = ids // math.ceil(num_rows / world)
    send = ids[torch.argsort(owner, stable=True)]
    counts = torch.bincount(owner, minlength=world).tolist()
    received = torch.empty(len(ids), dtype=ids.dtype)
    dist.all_to_all_single(received, send, counts, counts)
    return received


def route_on_rank_0_only(ids, num_rows):
    if dist.get_rank() == 0:
        return route_solution(ids, num_rows)
    return ids


def route_with_a_typo(ids, num_rows):
    return route_solution(ids, num_row)  # noqa: F821


def route_as_float(ids, num_rows):
    return route_solution(ids, num_rows).float()


def route_unwritten(ids, num_rows):
    raise NotImplementedError()


def test_route_check_accepts_the_solution(capsys):
    lab01.check_route_ids(route_solution)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [
        (route_modulo, r"id % 2"),
        (route_without_counts, r"exchange the counts first"),
        (route_sorted, r"wrong order \(they were sorted\)"),
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
    def reversed_within_sender(ids, num_rows):
        return route_solution(ids.flip(0), num_rows)

    with pytest.raises(CheckFailed, match="wrong order") as info:
        lab01.check_route_ids(reversed_within_sender)
    assert "stable=True" in info.value.hint


def test_route_check_catches_a_wrong_output_size_that_does_not_crash():
    def truncated(ids, num_rows):  # right ids, but only as many as this rank sent
        return route_solution(ids, num_rows)[: len(ids)]

    with pytest.raises(CheckFailed, match="rank 1 returned 3 ids but owns 5"):
        lab01.check_route_ids(truncated)


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
