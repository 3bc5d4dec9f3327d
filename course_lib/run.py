"""``python -m course_lib.run MODULE:FUNCTION [ARGS]``: the course's torchrun entry point.

The runner lives in :mod:`course_lib.launcher.run`; this module keeps the short command that the labs,
the README and cluster scripts use.
"""
import sys

from course_lib.launcher.run import main

if __name__ == "__main__":
    sys.exit(main())
