"""Memory bandwidth against embedding lookup bandwidth on this machine: how close a fused EBC gets to the limit.

    .venv/bin/python benchmarks/lookup_bandwidth.py [--rows 2000000] [--dim 64] [--repeats 5]

memory copy: a 256 MiB float32 tensor copied into another (bytes read + written per second).
lookup: forward passes of a fused EBC (fbgemm's table-batched kernel) over uniformly random ids on one
table far larger than the CPU caches (bytes of embedding rows read per second). Both are the best of
`--repeats` runs (course_lib.bandwidth); every figure is measured in this run.
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
    parser.add_argument("--repeats", type=int, default=5)
    opts = parser.parse_args()

    import torch

    from course_lib import bandwidth
    from course_lib.launcher import quiet

    quiet.install()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    copy = bandwidth.memory_bandwidth(repeats=opts.repeats)
    lookup = bandwidth.lookup_bandwidth(opts.rows, opts.dim, opts.batch_size, opts.ids_per_bag, repeats=opts.repeats)
    print(copy)
    print(f"{lookup}   (table {opts.rows:,} x {opts.dim}, {opts.batch_size} bags x {opts.ids_per_bag} ids)")
    print(f"ratio lookup / memory copy = {lookup.gb_per_s / copy.gb_per_s:.2f}")


if __name__ == "__main__":
    main()
