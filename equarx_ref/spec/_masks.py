"""The spec's check of a bool mask: a sign per element or a flag per block, of a given shape.

`elements.codes` takes the signs of its grid indices and `scale.block_scale` the tiny flags of
its blocks; both refuse anything but a bool array of exactly the shape of the array it goes with,
in one line naming both (a TypeError, as the other checks of the spec's inputs, `_checks.py`).

It lives apart from `_checks.py` because that module is part of the code every stored record's
digest covers (the package's formats.py imports spec/formats.py, which imports it:
docs/gen/provenance.py), while this check is only the spec's elements and scale: a function
added there would make every record stale, here none.
"""

from __future__ import annotations

import numpy as np


def mask(value, shape: tuple[int, ...], what: str, like: str) -> np.ndarray:
    """`value` as a bool array of `shape`, the shape of the array named `like`; refused in one
    line otherwise."""
    out = np.asarray(value)
    if out.dtype != bool or out.shape != shape:
        raise TypeError(f"{what} must be a bool array of {like}'s shape {shape}, got "
                        f"{out.dtype} {out.shape}")
    return out
