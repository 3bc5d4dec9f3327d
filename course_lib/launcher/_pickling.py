"""cloudpickle as the launcher uses it: functions by value, and every module by name.

cloudpickle picks its reducer by the object's exact type, so a module whose type subclasses
``types.ModuleType`` misses its module reducer and is pickled like any object, which fails. torch has such
modules: its config modules (``torch.distributed.config``, ``fbgemm_gpu.config``, ``torch._dynamo.config``)
are instances of a ``ConfigModuleInstance`` class. cloudpickle also ships the submodules a function may
reach through a global module: a notebook function that uses ``dist`` (``torch.distributed``) and any
attribute named ``config`` (``log.config``) takes ``torch.distributed.config`` along, and the launch failed
with "cannot pickle 'ConfigModuleInstance' object". Here every importable module travels by name.
"""
from __future__ import annotations

import importlib
import io
import pickle
import sys
import types
from typing import Any

import cloudpickle

__all__ = ["dumps", "loads"]

loads = cloudpickle.loads


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if (
            isinstance(obj, types.ModuleType)
            and type(obj) is not types.ModuleType
            and sys.modules.get(obj.__name__) is obj
        ):
            return importlib.import_module, (obj.__name__,)
        return super().reducer_override(obj)


def dumps(obj: Any, protocol: int | None = None) -> bytes:
    """``cloudpickle.dumps``, with modules of ModuleType subclasses pickled by name."""
    with io.BytesIO() as buffer:
        _Pickler(buffer, protocol=pickle.DEFAULT_PROTOCOL if protocol is None else protocol).dump(obj)
        return buffer.getvalue()
