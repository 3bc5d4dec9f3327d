"""Run a course function under torchrun, unchanged: ``python -m course_lib.run MODULE:FUNCTION [ARGS]``.

    torchrun --nproc-per-node 2 -m course_lib.run course_lib.demos:all_reduce_ranks
    torchrun --nnodes 2 --nproc-per-node 8 --node-rank $NODE_RANK \\
        --master-addr $HEAD_NODE --master-port 29500 -m course_lib.run mypkg.train:main 100

torchrun starts the processes and sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, ...; this module does
what ``launch()`` does inside each rank (quiet warnings, share the CPU cores, bind the GPU under NCCL,
initialise the process group), calls the function, prints what it returned and tears the group down.
Arguments are Python literals when they parse as such (``3``, ``0.1``, ``"[1, 2]"``), strings otherwise.
"""
from __future__ import annotations

import argparse
import ast
import importlib
import os
import sys
from typing import Any, Callable

from course_lib.launcher import _rank


def load_function(spec: str) -> Callable[..., Any]:
    """Import ``MODULE:FUNCTION`` (the current folder is importable, as for ``python -m``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise SystemExit(f"course_lib.run: expected MODULE:FUNCTION, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    target: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if not callable(target):
        raise SystemExit(f"course_lib.run: {spec} is not callable")
    return target


def parse_arg(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m course_lib.run", description=__doc__.splitlines()[0])
    parser.add_argument("function", help="MODULE:FUNCTION to run on every rank")
    parser.add_argument("args", nargs="*", help="positional arguments (Python literals or strings)")
    parser.add_argument("--backend", default="auto", choices=["gloo", "nccl", "auto"])
    parser.add_argument("--timeout", type=float, default=1800, help="collective timeout in seconds")
    opts = parser.parse_args(argv)

    missing = [v for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if v not in os.environ]
    if missing:
        raise SystemExit(
            f"course_lib.run: {', '.join(missing)} not set: start this under torchrun, e.g. "
            "`torchrun --nproc-per-node 2 -m course_lib.run MODULE:FUNCTION`"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = opts.backend
    if backend == "auto":
        import torch

        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= local_world_size else "gloo"
    fn = load_function(opts.function)
    _rank.prepare_rank(backend, local_rank, local_world_size)
    _rank.init_group(backend, "env://", rank, world_size, opts.timeout)
    try:
        value = fn(*[parse_arg(a) for a in opts.args])
    finally:
        _rank.destroy_group()
    print(f"[course_lib.run] rank {rank}/{world_size} ({backend}) returned: {value!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
