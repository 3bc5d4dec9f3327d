"""One call at the top of every lab: ``course_lib.launcher.notebook.setup()``.

It filters the library warnings that teach nothing (course_lib.launcher.quiet), fixes the random seeds and sets
plot defaults, so every lab starts from the same state and its outputs match the stored solution's.
"""
from __future__ import annotations

import os
import random


def setup(seed: int = 0) -> None:
    """Prepare this kernel for a lab: quiet known warnings, seed RNGs, plot defaults."""
    from course_lib.launcher import quiet

    quiet.install()
    random.seed(seed)
    os.environ.setdefault("PYTHONHASHSEED", str(seed))
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    try:
        import torch

        torch.manual_seed(seed)
    except ImportError:
        pass
    try:
        import matplotlib

        matplotlib.rcParams.update({"figure.figsize": (6.4, 3.2), "figure.dpi": 90, "axes.grid": True})
    except ImportError:
        pass
