"""The block scale: one number per block that maps its values onto the element grid.

    bf16/f32  the smallest scale-dtype value s with s * elem_max >= amax; if that
              s * elem_max exceeds f32's maximum, the scale-dtype value just below it
              (the block's largest elements then saturate at +-elem_max)
    E8M0 (MX) 2^k stored as the byte k + 127: by OCP MX v1.0's floor rule (the default),
              k = floor(log2(amax)) - emax_elem (emax_elem the exponent of the grid's
              largest value), elements saturating at +-elem_max; by the ceil rule, on
              request, k = ceil(log2(amax / elem_max)), so nothing clips

Every comparison is exact: s has at most 24 significant bits and elem_max at most 12, so
s * elem_max is exact in float64; no division decides anything (a quotient is only a guess,
settled by stepping the scale's bit pattern until the comparisons hold).
"""

from __future__ import annotations

import numpy as np

from . import _checks, _masks
from .formats import E8M0_BIAS, F32_MAX, F32_TINY, SCALE_TYPES, check_format, scale_rule


def pow2(k: np.ndarray) -> np.ndarray:
    """2.0**k in float64, exactly, for integers k."""
    k = np.asarray(k)
    if k.dtype == bool or not (np.issubdtype(k.dtype, np.integer) or (
            np.issubdtype(k.dtype, np.floating) and np.all(np.mod(k, 1) == 0))):
        raise TypeError(f"k must hold integers (exponents), got {k.dtype} {k.ravel()[:3]}")
    return np.ldexp(1.0, k.astype(np.int64))


def _emax(emax) -> float:
    """The grid's largest value: a finite number > 0."""
    if isinstance(emax, (bool, np.bool_)) or not isinstance(emax, (int, float, np.integer,
                                                                    np.floating)):
        raise TypeError(f"emax must be a number (the grid's largest value), got {emax!r}")
    if not np.isfinite(emax) or emax <= 0:
        raise ValueError(f"emax must be a finite number > 0 (the grid's largest value), got "
                         f"{emax!r}")
    return float(emax)


def _amax(amax, *, positive: bool) -> np.ndarray:
    """Block maxima: a float array of values >= 0 (> 0 with positive=True), finite."""
    a = _checks.array(amax, "amax").astype(np.float64)
    bad = ~np.isfinite(a) | (a <= 0 if positive else a < 0)
    if bad.any():
        rule = "> 0" if positive else ">= 0"
        raise ValueError(f"amax must be finite and {rule} here, got {a[bad][0]!r}")
    return a


def e8m0_exponent(amax: np.ndarray, emax: float) -> np.ndarray:
    """k = ceil(log2(amax / emax)) for amax > 0, exactly: 2^(k-1) emax < amax <= 2^k emax
    (amax = 0 gives the k the guess starts from)."""
    amax, emax = _amax(amax, positive=False), _emax(emax)
    _, e = np.frexp(np.where(amax > 0, amax / emax, 1.0))  # a guess within one of k
    k = e.astype(np.int64)
    for _ in range(3):
        k = np.where(pow2(k) * emax < amax, k + 1, k)
        k = np.where(pow2(k - 1) * emax >= amax, k - 1, k)
    if not np.all((pow2(k) * emax >= amax) & ((pow2(k - 1) * emax < amax) | (amax == 0))):
        raise RuntimeError("e8m0_exponent: the exponent search did not settle")  # a spec bug
    return k


def smallest_covering(amax: np.ndarray, emax: float, scale_type: str) -> np.ndarray:
    """The smallest scale_type value s >= f32's smallest normal with s * emax >= amax (amax > 0,
    finite). A block needing less is tiny (the caller's rule), so the search stops there."""
    amax, emax = _amax(amax, positive=True), _emax(emax)
    if scale_type not in SCALE_TYPES:
        raise ValueError(f"scale_type must be one of {', '.join(SCALE_TYPES)} (E8M0 scales are "
                         f"powers of two: e8m0_exponent), got {scale_type!r}"[:300])
    dtype, bits = SCALE_TYPES[scale_type]
    floor = int(np.asarray(F32_TINY, dtype).view(bits))
    guess = np.maximum(amax / emax, F32_TINY).astype(dtype).view(bits).astype(np.int64)

    def value(b):
        return np.maximum(b, floor).astype(bits).view(dtype).astype(np.float64)

    def covers(b):
        return value(b) * emax >= amax  # exact: <= 24 + 16 significant bits

    b = guess
    for _ in range(4):  # positive floats order like their bit patterns: step by one pattern
        b = np.where(~covers(b), b + 1, b)
        b = np.where(covers(b - 1) & (b > floor), b - 1, b)
    if not np.all(covers(b) & (~covers(b - 1) | (b == floor))):
        raise RuntimeError("smallest_covering: the scale search did not settle")  # a spec bug
    return value(b)


def block_scale(amax: np.ndarray, fmt, emax: float,
                tiny: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per block, from amax (float64, NaN or inf for a non-finite block) and whether the block
    is tiny (`formats.tiny_exponent`): (the stored scale, a bf16/f32 value or an E8M0 byte;
    the scale's value s as float64). A tiny block (the all-zero one among them) stores 0, or
    E8M0's smallest exponent, 2^-127."""
    check_format(fmt)
    amax, emax = _checks.array(amax, "amax", ndim=1).astype(np.float64), _emax(emax)
    if np.any(amax < 0):
        raise ValueError(f"amax must be >= 0 (a block's largest magnitude), got "
                         f"{amax[amax < 0][0]!r}")
    tiny = _masks.mask(tiny, amax.shape, "tiny", "amax")
    finite = np.isfinite(amax)
    amax_f = np.where(finite & ~tiny, amax, 0.0)
    if fmt.scale_dtype == "e8m0":
        if scale_rule(fmt) == "floor":
            _, e = np.frexp(np.where(amax_f > 0, amax_f, 1.0))  # amax in [2^(e-1), 2^e)
            _, f = np.frexp(emax)  # emax in [2^(f-1), 2^f): emax_elem = f - 1
            k = np.clip(e.astype(np.int64) - 1 - (f - 1), -E8M0_BIAS, 127)
        else:
            k = np.clip(e8m0_exponent(amax_f, emax), -E8M0_BIAS, 127)
        k = np.where(amax_f > 0, k, -E8M0_BIAS)  # tiny block: the smallest exponent
        stored = np.where(finite, k + E8M0_BIAS, 255).astype(np.uint8)  # 255: E8M0's NaN
        return stored, pow2(k)
    dtype, bits = SCALE_TYPES[fmt.scale_dtype]
    positive = np.where(amax_f > 0, amax_f, 1.0)
    s = np.where(amax_f > 0, smallest_covering(positive, emax, fmt.scale_dtype), 0.0)
    # the top grid value past f32's maximum: the scale one step below (elements saturate)
    below = np.maximum(s, F32_TINY).astype(dtype).view(bits)
    below = (below - 1).view(dtype).astype(np.float64)
    s = np.where(s * emax > F32_MAX, below, s)
    stored = np.where(finite, s, np.where(np.isnan(amax), np.nan, np.inf)).astype(dtype)
    return stored, s
