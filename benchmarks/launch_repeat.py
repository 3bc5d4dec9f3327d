"""Does lab 00's first launch ever fail? Run it many times and count failures and group restarts.

    .venv/bin/python benchmarks/launch_repeat.py [--cold 50] [--warm 300] [--world-size 2]

cold: a fresh Python process per run that imports course_lib and launches once (what a new kernel running
lab 00 does; gloo's rare "connectFullMesh failed" loopback error, pytorch #53270, showed up there).
warm: repeated launches from one process (a learner re-running the cell).
A "restart" is a launch whose process group did not form and that launch() started again (it says so on
stderr); a "failure" is a launch that raised. Every figure is counted in this run.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
import time

RESTART_LINE = "the process group did not form"

HELLO = '''
import torch, torch.distributed as dist
from course_lib import launch

def hello():
    rank = dist.get_rank()
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    return t.item()
'''


def cold(runs: int, world_size: int) -> tuple[int, int, float]:
    """(failures, restarts, seconds) over ``runs`` fresh processes."""
    code = HELLO + f"\nassert launch(hello, world_size={world_size}) == [float(sum(range({world_size})))] * {world_size}\n"
    failures = restarts = 0
    start = time.perf_counter()
    for i in range(runs):
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        restarts += proc.stderr.count(RESTART_LINE)
        if proc.returncode != 0:
            failures += 1
            print(f"cold run {i}: failed\n{proc.stderr[-2000:]}", file=sys.stderr)
    return failures, restarts, time.perf_counter() - start


def warm(runs: int, world_size: int) -> tuple[int, int, float]:
    """(failures, restarts, seconds) over ``runs`` launches from this process."""
    namespace: dict[str, object] = {}
    exec(HELLO, namespace)
    launch, hello = namespace["launch"], namespace["hello"]
    want = [float(sum(range(world_size)))] * world_size
    failures = restarts = 0
    start = time.perf_counter()
    for i in range(runs):
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ok = launch(hello, world_size=world_size) == want  # type: ignore[operator]
        except Exception as e:
            ok = False
            print(f"warm run {i}: {type(e).__name__}: {str(e)[:500]}", file=sys.stderr)
        restarts += err.getvalue().count(RESTART_LINE)
        failures += not ok
    return failures, restarts, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cold", type=int, default=50)
    parser.add_argument("--warm", type=int, default=300)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    print("| runs | kind | failed | group restarts | seconds |\n|---|---|---|---|---|")
    for kind, fn, n in (("cold (new process)", cold, args.cold), ("warm (same process)", warm, args.warm)):
        if n:
            failures, restarts, seconds = fn(n, args.world_size)
            print(f"| {n} | {kind} | {failures} | {restarts} | {seconds:.0f} |", flush=True)


if __name__ == "__main__":
    main()
