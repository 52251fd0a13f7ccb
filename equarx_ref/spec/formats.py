"""Formats as plain data: each format name's element grid, its bits, and the scale types.

A format is read from its public fields only: `name` (the element type), `block_size`,
`scale_dtype` ("bfloat16", "float32" or "e8m0") and, for E8M0, `scale_rule` ("floor", OCP MX
v1.0's and the default, or "ceil"). The package's `Format` carries them; so may any object
with those attributes.

Element grids come from ml_dtypes, not from the package: code i of a float element (sign bit
clear) has the value ml_dtypes gives its bit pattern; a symmetric integer of N bits has the
grid 0 .. 2^(N-1) - 1, its codes two's complement.

These tables are the formats' one source: the package's `Format` reads them too (its float
elements' exponent and mantissa bits, smallest normal exponent and largest value are ml_dtypes'
`finfo` of the type here). A new element format is a row of `ELEMENTS`; a new MX preset a row
of `MX` (its element format and an E8M0 scale).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from . import _checks

F32_TINY = float(np.finfo(np.float32).tiny)  # 2^-126, f32's smallest normal
F32_MAX = float(np.finfo(np.float32).max)
E8M0_BIAS = 127

#: The MX presets (OCP MX v1.0): each name's element format; its scale is always E8M0.
MX = {"mxfp8": "fp8_e4m3", "mxfp6_e2m3": "fp6_e2m3", "mxfp6_e3m2": "fp6_e3m2",
      "mxfp4": "fp4_e2m1", "mxint8": "int8"}
#: Element type of each format name: ml_dtypes float type (None: symmetric integer) and bits;
#: an MX preset has its element format's.
ELEMENTS = {
    **{f"int{b}": (None, b) for b in (8, 4, *range(2, 13))},
    "fp8_e4m3": (ml_dtypes.float8_e4m3fn, 8),
    "fp8_e5m2": (ml_dtypes.float8_e5m2, 8),
    "fp6_e2m3": (ml_dtypes.float6_e2m3fn, 6),
    "fp6_e3m2": (ml_dtypes.float6_e3m2fn, 6),
    "fp4_e2m1": (ml_dtypes.float4_e2m1fn, 4),
}
ELEMENTS.update({name: ELEMENTS[element] for name, element in MX.items()})
# Scale types with a value: (NumPy type, unsigned type of its bit pattern).
SCALE_TYPES = {"bfloat16": (ml_dtypes.bfloat16, np.uint16), "float32": (np.float32, np.uint32)}


def grid(name: str) -> tuple[np.ndarray, int]:
    """(non-negative element values in code order, element bits): code i has value grid[i]."""
    dtype, bits = ELEMENTS[_checks.name(name, "name", ELEMENTS)]
    if dtype is None:  # symmetric integers 0..2^(bits-1)-1, two's complement codes
        return np.arange(2 ** (bits - 1), dtype=np.float64), bits
    # ml_dtypes' sub-byte floats occupy the low bits of one byte each
    values = np.arange(2 ** (bits - 1), dtype=np.uint8).view(dtype).astype(np.float64)
    values = values[np.isfinite(values)]  # e4m3fn ends in NaN, e5m2 in inf and NaNs
    if not np.all(np.diff(values) > 0):  # what every rule here reads a grid as
        raise RuntimeError(f"ml_dtypes' {dtype.__name__} codes do not order like their values")
    return values, bits


def tiny_exponent(name: str) -> int:
    """The tiny-block threshold as a biased f32 exponent: a block is tiny when its amax's
    exponent field (bits 23..30) is below it, i.e. amax < 2^(emax_elem + 1 - g - 126), with
    2^emax_elem <= elem_max < 2^(emax_elem + 1) and 2^g the grid's smallest positive value.
    Any other block's scale s has s * 2^g >= 2^-125: every value it dequantizes to is a
    normal f32, and a subnormal input is below half its smallest step."""
    G, _ = grid(name)
    emax_elem = int(np.frexp(G[-1])[1]) - 1
    g = int(np.frexp(G[1])[1]) - 1  # G[1] is a power of two: 1, or a float grid's 2^(emin-m)
    return emax_elem + 2 - g


def is_int(name: str) -> bool:
    """Symmetric integer elements (two's complement codes), else a float grid."""
    return ELEMENTS[_checks.name(name, "name", ELEMENTS)][0] is None


def check_format(fmt, what: str = "fmt"):
    """`fmt` if the spec can read it (the module essay's fields, with values the package's
    `Format` accepts), else a ValueError or TypeError naming the field, in one line."""
    return _checks.fmt(fmt, ELEMENTS, what, mx=MX)


def scale_rule(fmt) -> str:
    """"floor" (OCP MX v1.0: E8M0 scales' default) or "ceil" (the smallest scale that covers
    amax: every other scale type's rule, and E8M0's on request)."""
    check_format(fmt)
    rule = getattr(fmt, "scale_rule", None)
    return rule or ("floor" if getattr(fmt, "scale_dtype", None) == "e8m0" else "ceil")
