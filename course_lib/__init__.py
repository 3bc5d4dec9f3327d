"""course_lib: the library behind the *TorchRec & FSDP in Practice* labs.

Importing it is cheap (no torch import): heavy modules load on first use, so the launcher's parent side
stays light and a cold launch is not slowed by imports it does not need.
"""
from __future__ import annotations

import importlib
from typing import Any

# launch.py imports no torch at module level, so this stays cheap. Imported eagerly so that the name
# `course_lib.launch` is the function; the module is `course_lib.launcher.launch`.
from course_lib.launcher.launch import LaunchError, launch
from course_lib.launcher.ranks import Ranks

__version__ = "0.1.0"

_LAZY = {
    "doctor": ("course_lib.env", "doctor"),
}

__all__ = ["LaunchError", "Ranks", "launch", *sorted(_LAZY)]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'course_lib' has no attribute {name!r}")
