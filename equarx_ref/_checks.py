"""One way to refuse a bad count: every public function that takes a number of things uses it.

A count is a Python or NumPy integer, never a bool (`True` is an int to Python, not a count),
at least `minimum` and at most `maximum`; anything else is refused with a message naming the
argument and the value.
"""

from __future__ import annotations

import numpy as np

__all__ = ["count"]


def count(value, what: str, *, minimum: int = 1, maximum: int | None = None) -> int:
    """`value` as an int, or TypeError/ValueError naming `what` and the allowed range."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an integer, got {value!r}")
    value = int(value)
    if value < minimum or (maximum is not None and value > maximum):
        allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{what} must be {allowed}, got {value}")
    return value
