"""A folder's modules as attributes, loaded on first read: `eq.models.cost` as `eq.gemma` is.

The package's root loads its folders when they are first read (`equarx_ref/__init__.py`);
each folder then loads its own modules the same way, so `eq.models.predict.wire_bytes` and
`eq.runs.sweep` work without an import line of their own, and importing a folder costs
nothing until one of its modules is read. A folder's `__init__` says:

    from .._lazy import submodules
    __getattr__ = submodules(__name__)
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType


def submodules(package: str) -> Callable[[str], ModuleType]:
    """The module `__getattr__` (PEP 562) of `package`: a public name that is one of its
    modules imports it; any other name is the usual AttributeError."""

    def __getattr__(name: str) -> ModuleType:
        if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}"):
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
