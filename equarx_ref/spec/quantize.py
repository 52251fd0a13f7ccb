"""A block quantized by the rules: its stored scale, codes, payload and dequantized values.

    amax  = max |x| over the block
    scale = scale.py's rule            element = elements.py's rounding of |x| / s
    x'    = +-grid[element] * s        (float64, exact; saturated to f32's finite range)

Edge cases: a subnormal input reads as a zero of its sign; a tiny block (amax below a power of
two fixed by the format, `formats.tiny_exponent`; all-zero blocks among them) has scale 0
(E8M0: 2^-127) and a zero payload (a float code keeps the value's sign: -0); a NaN or
infinity makes the block's scale non-finite (E8M0: the NaN byte 255), its payload 0 and its
values NaN.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from . import _checks
from .elements import codes as element_codes
from .elements import nearest, pack, stochastic
from .formats import F32_MAX, F32_TINY, check_format, grid, is_int, tiny_exponent
from .scale import block_scale


@dataclasses.dataclass
class SpecQuantized:
    """What the spec computes for blocks `[blocks, B]`."""

    scales: np.ndarray  # stored: bf16 / f32 values, or uint8 E8M0 codes
    codes: np.ndarray  # uint8 [blocks, B]: one element code per value (unpacked)
    payload: np.ndarray  # uint8 [blocks, B * bits / 8]: packed as on the wire
    values: np.ndarray  # f32 [blocks, B]: dequantized
    finite: np.ndarray  # bool [blocks]: the block was finite


def quantize_blocks(x: np.ndarray, fmt, uniforms: np.ndarray | None = None) -> SpecQuantized:
    """The spec's quantizer for f32 blocks `x` of shape `[blocks, fmt.block_size]`; with
    `uniforms` (f32 in [0, 1), x's shape: `jax.random.uniform(key, ...)`'s draws), stochastic
    rounding. No blocks (shape [0, B]) give empty arrays of the same kinds."""
    check_format(fmt)
    x = _checks.blocks(x, fmt.block_size).astype(np.float32)
    if uniforms is not None:
        uniforms = _checks.uniforms(uniforms, x.shape)
    x = np.where(np.abs(x) < F32_TINY, np.copysign(np.float32(0), x), x)  # subnormal: +-0
    G, bits = grid(fmt.name)
    emax = float(G[-1])
    a = np.abs(x.astype(np.float64))
    amax = a.max(axis=1)
    finite = np.isfinite(amax)
    exponent = (amax.astype(np.float32).view(np.uint32) >> 23) & 0xFF  # amax's exponent bits
    tiny = finite & (exponent < tiny_exponent(fmt.name))
    stored, s = block_scale(amax, fmt, emax, tiny)
    s = np.where(tiny, 0.0, s)  # a tiny block carries a zero payload (E8M0: its scale 2^-127)

    a = np.where(finite[:, None], a, 0.0)
    a = np.minimum(a, emax * s[:, None])  # saturate (floor rule, a scale stepped down, 2^-127)
    idx = nearest(a, s, G) if uniforms is None else stochastic(a, s, G, uniforms)
    sign = np.signbit(x) & finite[:, None]
    c = element_codes(idx, sign, bits, is_int(fmt.name))

    # dequantize: the code's value (integer code 0 is +0; a float code keeps its sign) times s
    negative = sign & ((idx > 0) | (not is_int(fmt.name)))
    product = np.where(negative, -G[idx], G[idx]) * s[:, None]  # exact in float64
    values = np.clip(product, -F32_MAX, F32_MAX).astype(np.float32)
    values = np.where(finite[:, None], values, np.float32(np.nan))
    return SpecQuantized(stored, c, pack(c, bits), values, finite)


def to_blocks(x: np.ndarray, block_size: int) -> np.ndarray:
    """Flatten floats of any shape to f32 and zero-pad to whole blocks: [blocks, B] (an empty
    array gives no blocks, [0, B]; a 0-d one, one block)."""
    block_size = _checks.count(block_size, "block_size", maximum=_checks.MAX_BLOCK_SIZE)
    flat = _checks.array(x, "x").astype(np.float32).reshape(-1)
    padded = np.pad(flat, (0, -flat.size % block_size))
    return padded.reshape(padded.size // block_size, block_size)


def round_trip(x: np.ndarray, fmt) -> np.ndarray:
    """dequantize(quantize(x)) of a 1-D float array whose length is a multiple of the block."""
    check_format(fmt)
    x = _checks.array(x, "x", ndim=1)
    if x.size % fmt.block_size:
        raise ValueError(f"x must hold whole blocks of fmt.block_size = {fmt.block_size} "
                         f"values (to_blocks pads), got {x.size}")
    return quantize_blocks(to_blocks(x, fmt.block_size), fmt).values.reshape(-1)
