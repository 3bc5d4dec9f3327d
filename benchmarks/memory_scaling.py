"""Per-rank memory against world size: row-wise sharded tables (DMP) and a dense model under FSDP2, against the formulas.

    .venv/bin/python benchmarks/memory_scaling.py [--ranks 1 2 4] [--rows 50000]

tables: 4 tables of `--rows` x 64 float32, row-wise over all ranks; formula ceil(rows / ranks) rows each.
FSDP: lab 06's TinyTransformer after one Adam step (parameters + gradients + Adam state); formula
memory.zero_bytes(num_params, ranks, stage=3). Measured by course_lib.capstone.memory_scaling (the
largest rank's bytes); "x formula" is measured / formula.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rows", type=int, default=50_000)
    opts = parser.parse_args()

    import pandas as pd

    from course_lib import capstone
    from course_lib.launcher import quiet

    quiet.install()
    frame = capstone.memory_scaling(opts.ranks, num_embeddings=opts.rows)
    with pd.option_context("display.width", 160, "display.max_columns", 20):
        print(frame.round(3))
    base = frame.iloc[0]
    for ranks, row in frame.iterrows():
        print(f"{ranks} ranks: tables {base['tables MB/rank'] / row['tables MB/rank']:.2f}x less per rank, "
              f"FSDP {base['FSDP MB/rank'] / row['FSDP MB/rank']:.2f}x less (vs {frame.index[0]} rank)")


if __name__ == "__main__":
    main()
