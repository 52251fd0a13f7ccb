"""The spec's argument checks: an oracle never answers a malformed question.

Every public function of the spec checks what it is given before it computes, as strictly as the
package's `eq.quantize` and `eq.all_reduce` do (equarx_ref/_checks.py is theirs; this one is
NumPy only, like the rest of the spec): a format is an object with the fields the spec reads and
values it knows; an array holds real floating-point values (never integers, booleans, complex
numbers or Python objects) in the shape the rule is written for; a count is an integer, not a
bool. Anything else is refused with one line naming the argument, a ValueError or TypeError
raised by a plain `if` (an `assert` would vanish under `python -O`).
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np

SCALE_DTYPES = ("bfloat16", "float32", "e8m0")
SCALE_RULES = ("floor", "ceil")
MAX_BLOCK_SIZE = 1 << 16  # as the package's Format


def natural_sorted(names) -> list[str]:
    """Names in the order people count them: int2, int3, ..., int12 (not int10, int11, int2)."""
    return sorted(names, key=lambda s: [int(t) if t.isdigit() else t
                                        for t in re.split(r"(\d+)", str(s))])


def count(value, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an int (a Python or NumPy integer, never a bool) in range, else an error."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {value!r}"[:300])
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{what} must be {allowed}, got {value}")
    return int(value)


def name(value, what: str, known) -> str:
    """A format name the spec knows: one line listing the known ones otherwise."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a format name such as 'int8', got {value!r}"[:300])
    if value not in known:
        raise ValueError(f"{what} {value!r} is not a format the spec knows; known: "
                         f"{', '.join(natural_sorted(known))}")
    return value


def fmt(value, known, what: str = "fmt", mx=()):
    """A format as the spec reads it (formats.py): the fields `name`, `block_size`,
    `scale_dtype` and, optionally, `scale_rule`, with values the package's `Format` accepts
    (an MX name, one of `mx`, has an E8M0 scale; the floor rule is E8M0's; a block fills whole
    bytes)."""
    missing = [f for f in ("name", "block_size", "scale_dtype") if not hasattr(value, f)]
    if missing:
        raise TypeError(f"{what} must be a format: an object with the fields name, block_size "
                        f"and scale_dtype (equarx_ref.Format, or any with them), got "
                        f"{type(value).__name__} without {', '.join(missing)}")
    elem = name(value.name, f"{what}.name", known)
    bits = known[elem][1]
    block = count(value.block_size, f"{what}.block_size", maximum=MAX_BLOCK_SIZE)
    if block * bits % 8:
        raise ValueError(f"{what}.block_size must fill whole bytes with {bits}-bit elements "
                         f"({bits} x block_size a multiple of 8), got {block}")
    if value.scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"{what}.scale_dtype must be one of {', '.join(SCALE_DTYPES)}, got "
                         f"{value.scale_dtype!r}"[:300])
    if elem in mx and value.scale_dtype != "e8m0":
        raise ValueError(f"{what}.scale_dtype must be 'e8m0' for the MX format {elem}, got "
                         f"{value.scale_dtype!r}")
    rule = getattr(value, "scale_rule", None)
    if rule is not None and rule not in SCALE_RULES:
        raise ValueError(f"{what}.scale_rule must be None, 'floor' or 'ceil', got {rule!r}"[:300])
    if rule == "floor" and value.scale_dtype != "e8m0":
        raise ValueError(f"{what}.scale_rule 'floor' is for E8M0 scales; a "
                         f"{value.scale_dtype} scale is always the smallest that covers amax")
    return value


def is_float_dtype(dtype) -> bool:
    """A real floating-point dtype: NumPy's, or one of ml_dtypes' (bfloat16, float8, ...)."""
    dtype = np.dtype(dtype)
    if np.issubdtype(dtype, np.floating):
        return True
    if dtype.kind != "V":
        return False
    try:
        ml_dtypes.finfo(dtype)
    except (TypeError, ValueError):
        return False
    return True


def array(value, what: str, *, ndim: int | None = None, min_ndim: int = 0,
          floating: bool = True) -> np.ndarray:
    """`value` as a NumPy array: of a real floating dtype (with floating=True), `ndim`
    dimensions (or at least `min_ndim`); refused in one line otherwise."""
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(f"{what} must be an array, got {type(value).__name__}")
    try:
        out = np.asarray(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an array, got {type(value).__name__}") from None
    if floating and not is_float_dtype(out.dtype):
        raise TypeError(f"{what} must hold real floating-point values, got dtype {out.dtype}; "
                        "cast to a float dtype first")
    if ndim is not None and out.ndim != ndim:
        raise ValueError(f"{what} must have {ndim} dimension{'s' if ndim != 1 else ''}, got "
                         f"shape {out.shape}")
    if out.ndim < min_ndim:
        raise ValueError(f"{what} must have at least {min_ndim} dimension"
                         f"{'s' if min_ndim != 1 else ''}, got shape {out.shape}")
    return out


def blocks(value, block_size: int, what: str = "x") -> np.ndarray:
    """Values laid out as blocks: a floating array of shape [blocks, block_size]."""
    out = array(value, what, ndim=2)
    if out.shape[1] != block_size:
        raise ValueError(f"{what} must be [blocks, fmt.block_size] = [blocks, {block_size}], "
                         f"got shape {out.shape}")
    return out


def uniforms(value, shape: tuple[int, ...], what: str = "uniforms") -> np.ndarray:
    """Stochastic rounding's draws: floats in [0, 1), one per value, of `shape`."""
    out = array(value, what)
    if out.shape != shape:
        raise ValueError(f"{what} must have x's shape {shape}, got {out.shape}")
    u = out.astype(np.float64)
    bad = ~((u >= 0) & (u < 1))
    if bad.any():
        raise ValueError(f"{what} must lie in [0, 1) (jax.random.uniform's draws), got "
                         f"{u[bad][0]!r}")
    return out
