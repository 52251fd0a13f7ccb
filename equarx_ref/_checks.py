"""One way to refuse a bad argument: every public function that takes a count, a flag, a
number or a dtype checks it here, so the rules and the messages are the same everywhere.

A count is a Python or NumPy integer, never a bool (`True` is an int to Python, not a count),
at least `minimum` and at most `maximum`. A flag is True or False (1 is not a flag). A number
is a real, finite int or float (not a bool, not a string). A value dtype is a floating dtype
(what `all_reduce` sums). Anything else is refused with a message naming the argument and the
value. An array is anything `jnp.asarray` takes (with `floating=True`, of a floating dtype).
`all_reduce`'s size gate `min_bytes` is None, "auto" or a byte count >= 0, checked here for
every entry point that takes it (`all_reduce`, `AllReduce`, `wire_bytes`), in one wording.
Names a message lists (the known formats) go in counting order (`natural_sorted`).
"""

from __future__ import annotations

import math
import re

import jax.numpy as jnp
import numpy as np

__all__ = ["DTYPE_ALIASES", "array", "count", "dtype_alias", "flag", "min_bytes",
           "natural_sorted", "number", "value_dtype"]

#: The short names the package prints for dtypes (tables, formats: "bf16"), read back.
DTYPE_ALIASES = {"bf16": "bfloat16", "f16": "float16", "fp16": "float16", "f32": "float32",
                 "fp32": "float32"}


def natural_sorted(names) -> list[str]:
    """Names as a message lists them, in counting order: int2, int3, ..., int12 (text order
    would give int10, int11, int12, int2)."""
    return sorted(names, key=lambda s: [int(t) if t.isdigit() else t
                                        for t in re.split(r"(\d+)", str(s))])


def count(value, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an int, or TypeError/ValueError naming `what` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{what} must be {allowed}, got {value}")
    return value


def min_bytes(value, *, chipless: str | None = None):
    """The size gate `min_bytes`: None (quantize when that sends fewer bytes), "auto" (the
    chip's crossover) or a byte count >= 0, returned as is (a count as an int). Anything else is
    refused in the one wording below, whichever entry point took it. `chipless` names a caller
    that cannot read a chip, which refuses "auto" (a good value elsewhere) by saying so."""
    if value is None:
        return None
    if isinstance(value, str) and value == "auto":
        if chipless is not None:
            raise ValueError(f"min_bytes='auto' needs the chip, which {chipless} cannot read: "
                             f"pass the chip's crossover, cost.default_min_bytes(...), as an int")
        return value
    rule = (f"min_bytes must be None (quantize when that sends fewer bytes), 'auto' (the chip's "
            f"crossover) or a byte count >= 0, got {value!r}")
    if isinstance(value, str):
        raise ValueError(rule)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(rule)
    if value < 0:
        raise ValueError(rule)
    return int(value)


def flag(value, what: str) -> bool:
    """`value` if it is True or False, else TypeError naming `what`."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be True or False, got {value!r}")
    return bool(value)


def number(value, what: str, *, positive: bool = True) -> float:
    """`value` as a finite float, > 0 (or >= 0 with positive=False), else an error naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                      np.floating)):
        raise TypeError(f"{what} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise ValueError(f"{what} must be a finite number {'> 0' if positive else '>= 0'}, "
                         f"got {value!r}")
    return value


def dtype_alias(dtype):
    """`dtype`, with a short name the package prints ("bf16", "f32") spelled out."""
    return DTYPE_ALIASES.get(dtype.lower(), dtype) if isinstance(dtype, str) else dtype


def value_dtype(dtype, what: str = "dtype") -> np.dtype:
    """`dtype` as a floating NumPy/JAX dtype (e.g. "bfloat16" or "bf16", jnp.float32), else an
    error."""
    try:
        out = jnp.dtype(dtype_alias(dtype)) if dtype is not None else None
    except TypeError:
        out = None
    if out is None or not jnp.issubdtype(out, jnp.floating):
        raise TypeError(f"{what} must be a floating dtype such as 'bfloat16' or 'float32', "
                        f"got {dtype!r}")
    return out


def array(value, what: str, *, floating: bool = False):
    """`value` as a jax array (floating-point with floating=True), else an error naming `what`."""
    try:
        out = jnp.asarray(value)
    except (TypeError, ValueError):
        raise TypeError(f"{what} must be an array, got {type(value).__name__}") from None
    if floating and not jnp.issubdtype(out.dtype, jnp.floating):
        raise TypeError(f"{what} must hold floating-point values, got dtype {out.dtype}")
    return out
