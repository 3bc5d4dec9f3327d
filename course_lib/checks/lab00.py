"""Checks for 00_setup: read a broken install report, and run a first process group."""
from __future__ import annotations

import warnings
from dataclasses import replace
from typing import Any, Callable, Mapping

from course_lib.checks import exercise, fail, passed
from course_lib.env import EnvFacts, Report, doctor

# A healthy CPU laptop with the course's pins, from which the broken states below are derived.
HEALTHY_LAPTOP = EnvFacts(
    python_version="3.11.7",
    torch_version="2.13.0+cpu",
    torchrec_version="1.8.0",
    fbgemm_gpu_version=None,
    fbgemm_gpu_cpu_version="1.8.0",
    torch_import_error=None,
    fbgemm_import_error=None,
    torchrec_import_error=None,
    torch_cuda=None,
    cuda_available=False,
    gpu_count=0,
    nccl_available=False,
    nccl_version=None,
    cpu_count=2,
)

FIXES: dict[int, str] = {
    1: "pip install torchrec==1.8.0   (reinstall torchrec the usual way)",
    2: "pip uninstall -y fbgemm-gpu && pip install fbgemm-gpu-cpu==1.8.0, then torchrec with --no-deps",
    3: "pip install torch==2.13.0   (the torch release that torchrec 1.8 is built against)",
    4: "install the NVIDIA driver and CUDA 12.6",
    5: "launch(..., backend='gloo')   (or backend='auto')",
    6: "pip install --upgrade torchrec   (the newest torchrec)",
}

_RIGHT = {"fbgemm-cuda-on-cpu": 2, "version-lockstep": 3, "nccl-without-gpu": 5}
_HINTS = {
    1: "a plain `pip install torchrec` is how this state usually arises: it pulls fbgemm-gpu, the CUDA build",
    4: "a driver does not give a laptop a GPU; which backend runs collectives on CPUs?",
    6: "the newest torchrec pairs with an even newer torch: the versions must move together",
}


def broken_reports() -> dict[str, Report]:
    """Three doctor() reports of broken setups, simulated from a healthy laptop."""
    cuda_fbgemm = replace(
        HEALTHY_LAPTOP,
        fbgemm_gpu_version="1.8.0",
        fbgemm_gpu_cpu_version=None,
        fbgemm_import_error="OSError: Could not load this library: .../site-packages/fbgemm_gpu/fbgemm_gpu_config.so",
    )
    old_torch = replace(
        HEALTHY_LAPTOP,
        torch_version="2.12.0+cpu",
        fbgemm_import_error="OSError: .../fbgemm_gpu/fbgemm_gpu_py.so: undefined symbol: _ZN3c1017RegisterOperators",
    )
    return {
        "A": doctor(facts=cuda_fbgemm),
        "B": doctor(facts=old_torch),
        "C": doctor(backend="nccl", world_size=2, facts=HEALTHY_LAPTOP),
    }


@exercise
def check_fixes(answers: Mapping[str, int]) -> None:
    """`answers` maps each report ("A", "B", "C") to the number of the fix in FIXES."""
    reports = broken_reports()
    if not isinstance(answers, Mapping) or set(answers) != set(reports):
        fail(f"answers must map each of {sorted(reports)} to a fix number, got {answers!r}")
    for label in sorted(reports):
        choice = answers[label]
        if choice not in FIXES:
            fail(f"report {label}: {choice!r} is not one of the fix numbers {sorted(FIXES)}")
        code = reports[label].problems[0].code
        if choice != _RIGHT[code]:
            fail(
                f"report {label}: fix {choice} does not cure it",
                _HINTS.get(choice, "read the report's ✗ line: what does it say is wrong, and with what?"),
            )
    passed("all three diagnoses matched to their fixes")


@exercise
def check_first_group(first_group: Callable[[], Any], launch: Callable[..., list[Any]] | None = None) -> None:
    """Run `first_group` on 2 and 3 ranks and check what each rank returned."""
    if launch is None:
        from course_lib import launch
    for world_size in (2, 3):
        with warnings.catch_warnings():  # 3 ranks on a 2-core laptop is fine for this check
            warnings.simplefilter("ignore", UserWarning)
            results = launch(first_group, world_size=world_size, show_ranks=[])
        for rank, got in enumerate(results):
            if not isinstance(got, dict) or not {"rank", "world_size", "rank_sum"} <= set(got):
                fail(f"rank {rank} returned {got!r}", "return a dict with keys 'rank', 'world_size', 'rank_sum'")
            if not isinstance(got["rank"], int) or not isinstance(got["world_size"], int):
                fail(
                    f"rank {rank} returned rank={got['rank']!r}, world_size={got['world_size']!r}",
                    "both must be ints: dist.get_rank() and dist.get_world_size() give them",
                )
            if (got["rank"], got["world_size"]) != (rank, world_size):
                fail(f"rank {rank} of {world_size} reported itself as rank {got['rank']} of {got['world_size']}")
            expected = world_size * (world_size - 1) / 2
            if float(got["rank_sum"]) != expected:
                hint = (
                    "each rank only knows its own rank: combine them across ranks with dist.all_reduce"
                    if float(got["rank_sum"]) == rank
                    else "all_reduce sums by default (ReduceOp.SUM); do not divide"
                )
                fail(f"on {world_size} ranks, rank {rank} got rank_sum={got['rank_sum']}, expected {expected:g}", hint)
    passed("first_group runs on 2 and 3 ranks and every rank agrees on the sum of ranks")
