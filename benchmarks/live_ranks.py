"""Round trip of a trivial cell on 2 live ranks (course_lib.Ranks) against a warm one-shot launch().

    .venv/bin/python benchmarks/live_ranks.py [--repeats 200]

Prints the medians and their ratio; every figure is measured in this run.
"""
from __future__ import annotations

import argparse
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--world-size", type=int, default=2)
    opts = parser.parse_args()

    from course_lib import Ranks, launch

    def median_of(call, repeats: int) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    for _ in range(3):  # warm the fork server (torch, then torchrec preloaded)
        launch(lambda: None, world_size=opts.world_size)
    time.sleep(5)
    one_shot = median_of(lambda: launch(lambda: None, world_size=opts.world_size), max(10, opts.repeats // 10))
    with Ranks(world_size=opts.world_size) as ranks:
        live = median_of(lambda: ranks.execute("None"), opts.repeats)
    print(f"ranks: {opts.world_size}")
    print(f"warm one-shot launch():   {one_shot * 1000:8.2f} ms (median)")
    print(f"live ranks, trivial cell: {live * 1000:8.2f} ms (median of {opts.repeats}; target <= 10 ms)")
    print(f"ratio live / one-shot:    {live / one_shot:8.4f}")


if __name__ == "__main__":
    main()
