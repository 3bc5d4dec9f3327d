"""Tiny distributed functions used by 00_setup, the launcher tests and the benchmarks.

They are ordinary module-level functions, so they run both under ``launch()`` and under ``torchrun``
(``python -m course_lib.run course_lib.demos:all_reduce_ranks``).
"""
from __future__ import annotations

import os


def all_reduce_ranks() -> float:
    """Sum every rank's number over the group with one all_reduce; every rank returns the same sum."""
    import torch
    import torch.distributed as dist

    value = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(value)
    return value.item()


def whoami() -> dict[str, str]:
    """The torchrun variables this rank sees, plus its backend and device."""
    import torch.distributed as dist

    names = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    seen = {name: os.environ.get(name, "") for name in names}
    seen["backend"] = dist.get_backend() if dist.is_initialized() else "none"
    return seen
