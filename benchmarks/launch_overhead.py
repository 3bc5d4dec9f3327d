"""Launcher overhead: the same trivial all_reduce through launch(), torch.multiprocessing.spawn and torchrun.

    .venv/bin/python benchmarks/launch_overhead.py [--ranks 2 4] [--repeats 3]

cold: a whole new Python process that launches once (its imports included), timed from outside.
warm: the 2nd and 3rd launch from one process (what a learner re-running a cell pays), timed inside it.
Prints the medians and the ratios against mp.spawn; every figure is measured in this run.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn_worker(rank: int, world_size: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    t = torch.tensor([float(rank)])
    dist.all_reduce(t)
    dist.destroy_process_group()


def _one_launch(method: str, ranks: int) -> None:
    if method == "launch":
        from course_lib import launch
        from course_lib.demos import all_reduce_ranks

        launch(all_reduce_ranks, world_size=ranks)
    elif method == "mp.spawn":
        import torch.multiprocessing as mp

        mp.spawn(_spawn_worker, args=(ranks, _free_port()), nprocs=ranks)
    else:
        torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
        subprocess.run(
            [torchrun, "--nproc-per-node", str(ranks), "--master-addr", "127.0.0.1", "--master-port",
             str(_free_port()), "-m", "course_lib.run", "--backend", "gloo", "course_lib.demos:all_reduce_ranks"],
            check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        )


def _child(method: str, ranks: int, launches: int) -> None:
    times = []
    for _ in range(launches):
        t = time.perf_counter()
        _one_launch(method, ranks)
        times.append(time.perf_counter() - t)
    print(json.dumps(times))


def _run_child(method: str, ranks: int, launches: int) -> tuple[float, list[float]]:
    t = time.perf_counter()
    out = subprocess.run(
        [sys.executable, __file__, "--child", method, "--ranks", str(ranks), "--launches", str(launches)],
        check=True, capture_output=True, text=True, cwd=REPO,
    )
    wall = time.perf_counter() - t
    return wall, json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--child", choices=["launch", "mp.spawn", "torchrun"])
    parser.add_argument("--launches", type=int, default=1)
    opts = parser.parse_args()
    if opts.child:
        _child(opts.child, opts.ranks[0], opts.launches)
        return

    methods = ["launch", "mp.spawn", "torchrun"]
    print(f"{'ranks':>5} {'method':>9} {'cold s':>8} {'warm s':>8}   (medians of {opts.repeats})")
    for ranks in opts.ranks:
        cold: dict[str, float] = {}
        warm: dict[str, float] = {}
        for method in methods:
            colds, warms = [], []
            for _ in range(opts.repeats):
                colds.append(_run_child(method, ranks, 1)[0])
                warms.extend(_run_child(method, ranks, 3)[1][1:])  # the 2nd and 3rd launch
            cold[method], warm[method] = statistics.median(colds), statistics.median(warms)
            print(f"{ranks:>5} {method:>9} {cold[method]:>8.3f} {warm[method]:>8.3f}")
        print(
            f"{ranks:>5} ratios: cold launch/mp.spawn = {cold['launch'] / cold['mp.spawn']:.2f} (target <= 1), "
            f"cold launch/torchrun = {cold['launch'] / cold['torchrun']:.2f}, "
            f"warm launch/mp.spawn = {warm['launch'] / warm['mp.spawn']:.3f} (target <= 0.15)"
        )


if __name__ == "__main__":
    main()
