"""Extension points: what the core's `all_reduce` needs from the folders above it, by name.

The core runs schedules and imports nothing above itself. A few of `all_reduce`'s arguments
ask for something that lives higher up: the default size gate and `min_bytes="auto"` are read
off the models, `hop_bits="adaptive"` is the error model's plan, `rotate=True` a remedy, and
`impl="mosaic"` / `impl="pallas"` the Pallas kernels. The core names each such need here, an
extension point with the contract of what it calls (`POINTS`), and looks it up (`provided`)
only when an argument asks for it. Which module provides each point is said from above: the
package's root (`equarx_ref/__init__.py`, which sits over every layer) registers where each
lives, as it says where each public name lives. So the core is read, tested and loaded without
the models, the remedies or the kernels, and Pallas loads only for a kernel `impl`.

    provided("hop_plan")(8, fmt=Format.int8(), algorithm="ring", hop_bits="adaptive")

Plain Python, no jax: the root registers at `import equarx_ref`, which loads nothing else.
"""

from __future__ import annotations

import importlib

__all__ = ["POINTS", "provided", "providers", "register"]

#: Each extension point of the core, and the contract of what it provides.
POINTS = {
    "size_gate": "min_bytes=None: (n, p, *, fmt, algorithm, dtype, num_chunks, hop_bits) -> "
                 "bool, whether n values sent quantized cost fewer bytes than sent as they are",
    "chip_gate": "min_bytes='auto': (p, *, fmt, algorithm, device_kind) -> int, the chip's "
                 "crossover in bytes (0 where no link is saved)",
    "hop_plan": "hop_bits='adaptive': (p, *, fmt, algorithm, hop_bits) -> schedule.HopPlan",
    "rotate": "rotate=True: (values, block) -> the values with each block rotated, f32",
    "unrotate": "rotate=True: (values, block) -> the inverse of `rotate`",
    "mosaic_codec": "impl='mosaic': a `wire.Codec` class, built (fmt, dtype), whose kernels "
                    "code every message; its `supports(fmt)` says which formats",
    "pallas_ring": "impl='pallas': (x, axis_name, *, fmt, algorithm, num_chunks) -> the sum, "
                   "the ring family as one kernel",
}

_WHERE: dict[str, str] = {}
_FOUND: dict[str, object] = {}


def register(point: str, where: str) -> None:
    """Say where `point` is provided: "module:name", the module relative to this package."""
    if point not in POINTS:
        raise ValueError(f"unknown extension point {point!r}; the core has {sorted(POINTS)}")
    module, _, name = where.partition(":")
    if not module or not name:
        raise ValueError(f"where must be 'module:name', got {where!r}")
    _WHERE[point] = where
    _FOUND.pop(point, None)


def providers() -> dict[str, str]:
    """Where each registered point is provided ("module:name"), by point."""
    return dict(_WHERE)


def provided(point: str):
    """What provides `point`, imported on first use."""
    if point not in _FOUND:
        if point not in _WHERE:
            raise LookupError(f"no provider registered for the core's extension point "
                              f"{point!r} ({POINTS.get(point, 'unknown')}); the package "
                              f"root registers them at `import equarx_ref`")
        module, _, name = _WHERE[point].partition(":")
        _FOUND[point] = getattr(importlib.import_module(f".{module}", __package__), name)
    return _FOUND[point]
