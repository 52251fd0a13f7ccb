"""The spec's data classes: small arrays on which every codec must give the spec's bits.

Twelve classes, each a 1-D f32 array of a few blocks for a format, seeded by the class and the
format's name (the same arrays on every machine): the cases where an implementation goes wrong
first. Rounding ties and one ulp either side; blocks at the tiny threshold and subnormal
inputs; f32's largest values; NaN and infinities; zeros of both signs; an outlier among small
values; bf16-valued data (amax / elem_max often exactly a scale value); heavy tails; normal
values near f32's smallest; and a length that is not a whole number of blocks.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from .formats import F32_MAX, F32_TINY, check_format, grid, tiny_exponent

BLOCKS = 6  # blocks per class (the odd length: 2.5)


def _ties(fmt, rng):
    """Values on grid points times s, on midpoints, and one ulp either side; amax sets s."""
    G, _ = grid(fmt.name)
    B = fmt.block_size
    s = rng.uniform(1, 2, BLOCKS).astype(ml_dtypes.bfloat16).astype(np.float64)
    s *= 2.0 ** rng.integers(-20, 20, BLOCKS)
    mids = (G[:-1] + G[1:]) / 2
    kind = rng.integers(0, 4, (BLOCKS, B))
    v = np.where(kind == 0, G[rng.integers(0, len(G), (BLOCKS, B))],
                 mids[rng.integers(0, len(mids), (BLOCKS, B))]) * s[:, None]
    x = v.astype(np.float32)
    x = np.where(kind == 2, np.nextafter(x, np.float32(np.inf)), x)
    x = np.where(kind == 3, np.nextafter(x, np.float32(0)), x)
    x = np.where(rng.random((BLOCKS, B)) < 0.5, -x, x)
    x[:, 0] = G[-1] * s
    return x


def _tiny(fmt, rng):
    """amax just below, at and above the tiny threshold 2^T (formats.tiny_exponent)."""
    top = 2.0 ** (tiny_exponent(fmt.name) - 127)
    scale = np.array([0.5, 1 - 2.0**-10, 1 - 2.0**-24, 1, 1 + 2.0**-10, 3])[:, None]
    x = rng.uniform(-1, 1, (BLOCKS, fmt.block_size)) * top * scale
    x[:, 0] = top * scale[:, 0]
    return x


def _subnormal(fmt, rng):
    """Subnormal inputs (read as zeros of their sign) among normal values, and alone."""
    x = rng.uniform(-1, 1, (BLOCKS, fmt.block_size)) * F32_TINY
    x[: BLOCKS // 2, 0] = 2.0 ** (tiny_exponent(fmt.name) - 127 + rng.integers(0, 20, 3))
    return x


def _huge(fmt, rng):
    """amax up to f32's largest value (itself in some blocks): saturation, no overflow."""
    top = min(F32_MAX, float(ml_dtypes.finfo(ml_dtypes.bfloat16).max) * grid(fmt.name)[0][-1])
    amax = top * (1 - np.array([0, 2.0**-24, 2.0**-8, 0.5, 0.75, 0.0]))
    x = rng.uniform(-1, 1, (BLOCKS, fmt.block_size)) * amax[:, None]
    x[:, 0] = amax * np.where(np.arange(BLOCKS) % 2, -1, 1)
    return x


def _non_finite(fmt, rng):
    """A NaN, +inf or -inf in some blocks (their blocks go NaN, the others stay)."""
    x = rng.standard_normal((BLOCKS, fmt.block_size))
    x[0, 3], x[1, 0], x[2, -1] = np.nan, np.inf, -np.inf
    return x


def _zeros(fmt, rng):
    x = np.zeros((BLOCKS, fmt.block_size))
    x[1::2, 1::2] = -0.0
    return x


def _outliers(fmt, rng):
    """One value 10^3 to 10^6 times the others in each block."""
    x = rng.standard_normal((BLOCKS, fmt.block_size))
    x[np.arange(BLOCKS), rng.integers(0, fmt.block_size, BLOCKS)] = 10.0 ** rng.uniform(3, 6,
                                                                                       BLOCKS)
    return x


def _bf16_valued(fmt, rng):
    x = rng.standard_normal((BLOCKS, fmt.block_size)).astype(ml_dtypes.bfloat16)
    return x.astype(np.float64) * 2.0 ** rng.integers(-30, 30, (BLOCKS, 1))


def _odd_length(fmt, rng):
    """Two and a half blocks: the tail is padded with zeros to a whole block."""
    return rng.standard_normal(5 * fmt.block_size // 2 + 1)[: 5 * fmt.block_size // 2]


#: Each class: (fmt, rng) -> values (any shape; flattened to f32).
CLASSES = {
    "gaussian": lambda fmt, rng: rng.standard_normal((BLOCKS, fmt.block_size))
    * 10.0 ** rng.uniform(-6, 6, (BLOCKS, 1)),
    "ties": _ties,
    "tiny": _tiny,
    "subnormal": _subnormal,
    "huge": _huge,
    "non-finite": _non_finite,
    "zeros": _zeros,
    "outliers": _outliers,
    "bf16-valued": _bf16_valued,
    "heavy tails": lambda fmt, rng: rng.standard_t(2, (BLOCKS, fmt.block_size)),
    "small normal": lambda fmt, rng: rng.uniform(-1, 1, (BLOCKS, fmt.block_size))
    * 10.0 ** rng.uniform(-33, -30, (BLOCKS, 1)),
    "odd length": _odd_length,
}


def make(name: str, fmt) -> np.ndarray:
    """Class `name` for `fmt`: a 1-D f32 array, the same on every machine."""
    check_format(fmt)
    if not isinstance(name, str) or name not in CLASSES:
        raise ValueError(f"name must be one of the data classes {', '.join(CLASSES)}, got "
                         f"{name!r}"[:300])
    rng = np.random.default_rng(list(f"{name}|{fmt.name}|{fmt.block_size}".encode()))
    with np.errstate(over="ignore"):
        x = np.asarray(CLASSES[name](fmt, rng), np.float64)
        return np.clip(x, -F32_MAX, F32_MAX, where=np.isfinite(x), out=x).astype(
            np.float32).ravel()
