"""The limit of an embedding lookup on this machine: a streaming copy and three reads of the same random rows,
with the ratio of each to the random-row limit.

    .venv/bin/python benchmarks/lookup_bandwidth.py [--rows 2000000] [--dim 64] [--batch-size 4096]
        [--ids-per-bag 32] [--threads 1 2] [--rounds 5] [--repeats 5] [--device cpu|cuda]

On one table (`--rows` x `--dim` fp32, far larger than the CPU caches) and one batch of uniformly random ids
(course_lib.bandwidth.compare_lookups): memory copy (256 MiB, bytes read + written per second), plain
`F.embedding_bag`, `index_select` into a reused buffer, and the fused EBC (fbgemm's TBE) on its own table, at
each `--threads` count. The random-row limit of a thread count is the best of the two plain torch reads;
every other figure is printed as a ratio to it. Best of `--rounds` x `--repeats` interleaved runs; every
figure is measured in this run.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=4096)
    parser.add_argument("--ids-per-bag", type=int, default=32)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda (then --threads only sets the host's threads)")
    opts = parser.parse_args()

    import torch

    from course_lib import bandwidth
    from course_lib.launcher import quiet

    quiet.install()
    lookup = bandwidth.random_lookup(opts.rows, opts.dim, opts.batch_size, opts.ids_per_bag, device=opts.device)
    print(f"torch {torch.__version__}, device {opts.device}, {os.cpu_count()} CPUs; {lookup.describe()}")
    rows = bandwidth.compare_lookups(lookup, threads=opts.threads, rounds=opts.rounds, repeats=opts.repeats)
    print(f"{'threads':>7}  {'method':<16} {'GB/s':>7}  {'x random-row limit':>18}")
    for row in rows:
        print(f"{row['threads']:>7}  {row['method']:<16} {row['GB/s']:>7.1f}  {row['ratio to random-row limit']:>18.2f}")
    for count, limit in bandwidth.random_row_limit(rows).items():
        print(f"random-row limit with {count} thread(s): {limit:.1f} GB/s (the best plain torch read of the same rows)")


if __name__ == "__main__":
    main()
