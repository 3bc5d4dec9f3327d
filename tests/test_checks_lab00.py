"""The 00_setup checks accept the solutions and reject plausible wrong answers."""
from __future__ import annotations

import sys

import cloudpickle
import pytest

from course_lib.checks import CheckFailed
from course_lib.checks import lab00

# Ship this module's functions by value: otherwise each rank imports the test module (and pytest) to find them.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def test_reports_show_the_three_broken_states():
    reports = lab00.broken_reports()
    assert [reports[k].problems[0].code for k in "ABC"] == ["fbgemm-cuda-on-cpu", "version-lockstep", "nccl-without-gpu"]
    assert "fbgemm_gpu_config.so" in str(reports["A"]) or "fbgemm-gpu 1.8.0" in str(reports["A"])


def test_fix_check_accepts_the_solution(capsys):
    lab00.check_fixes({"A": 2, "B": 3, "C": 5})
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "answers, words",
    [
        ({"A": 1, "B": 3, "C": 5}, "pulls fbgemm-gpu"),  # reinstalling torchrec the usual way
        ({"A": 2, "B": 6, "C": 5}, "move together"),  # newest torchrec
        ({"A": 2, "B": 3, "C": 4}, "which backend"),  # drivers on a laptop
        ({"A": 2, "B": 3}, "must map each"),
        ({"A": 2, "B": 3, "C": 9}, "not one of the fix numbers"),
    ],
)
def test_fix_check_rejects_wrong_answers(answers, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_fixes(answers)


def solution():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item()}


def no_all_reduce():
    import torch.distributed as dist

    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": float(dist.get_rank())}


def averaged():
    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(), "rank_sum": t.item() / dist.get_world_size()}


def env_strings():
    import os

    import torch
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return {"rank": os.environ["RANK"], "world_size": os.environ["WORLD_SIZE"], "rank_sum": t.item()}


def test_first_group_check_accepts_the_solution(capsys):
    lab00.check_first_group(solution)
    assert capsys.readouterr().out.startswith("✓")


@pytest.mark.parametrize(
    "wrong, words",
    [(no_all_reduce, "all_reduce"), (averaged, "do not divide"), (env_strings, "must be ints")],
)
def test_first_group_check_rejects_wrong_answers(wrong, words):
    with pytest.raises(CheckFailed, match=words):
        lab00.check_first_group(wrong)


def test_check_failure_renders_as_two_lines_in_ipython():
    err = CheckFailed("wrong", "look here")
    assert err._render_traceback_() == ["✗ wrong", "  hint: look here"]
