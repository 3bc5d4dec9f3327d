#!/usr/bin/env python3
"""The readability figures of the labs: the same command as `python -m course_lib.prose` (see its docstring).

    python tools/prose_stats.py solutions/*.ipynb ERRORS.md
    python tools/prose_stats.py --long 40 solutions/06_fsdp.ipynb
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from course_lib.prose import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
