"""Block scales: the one number per block that maps its values onto the element grid.

For a block with largest magnitude `amax` and a format whose grid tops out at `elem_max`:

    scale = the smallest scale-dtype value s with s * elem_max >= amax   (so nothing clips)

and it holds exactly, under `jit` and eagerly alike. That takes care: XLA turns a division by a
constant into a multiplication by a rounded reciprocal, which can land one scale step too high
or too low. So `block_scales` estimates with the reciprocal and then settles the close calls
with exact comparisons: with a bf16 scale (8 significant bits) the product s * elem_max is
exact in f32 and a plain comparison decides; an f32 scale is split into a 12-bit head and its
exact tail first (`split`, `product_vs`). Every such product is exact, so a fused multiply-add
(XLA:CPU contracts a*b + c) cannot change a comparison, and the estimate may be a few ulps off
(`reciprocal`: XLA:GPU's 1/y is not always correctly rounded): the steps cover it. The
quantizer (quantize.py) uses the same helpers to round each value exactly, and `range_factor`
keeps every product and difference there out of the subnormal range, which XLA:CPU flushes to
zero and GPUs keep.

Scales are rounded up to their dtype: a bf16 scale is at most 2^-7 (relative) above
amax / elem_max, which is all the precision a coarse scale costs.

MX formats use a power-of-two scale 2^k stored as an E8M0 byte k + 127: by default OCP MX
v1.0's k = floor(log2(amax)) - emax_elem, and the elements that land above elem_max saturate
to it; with `scale_rule="ceil"` k = ceil(log2(amax / elem_max)), so nothing clips (see
formats.py for the trade-off).

The scales of the edge cases (quantize.py's essay says what becomes of their values): a tiny
block (`is_tiny`, read off amax's exponent bits; the all-zero block among them) gets 0 (E8M0:
2^-127, its smallest); near f32's
maximum, where s * elem_max would pass 3.4e38, the step below, the largest scale whose grid
top stays finite; a block with a NaN or infinity a non-finite scale (E8M0: 255, its NaN).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .formats import Format

E8M0_BIAS = 127


def pow2(k: jax.Array) -> jax.Array:
    """2.0**k in f32, exact, for integer k in [-126, 127] (built from the exponent bits)."""
    return lax.bitcast_convert_type(((k + 127) << 23).astype(jnp.int32), jnp.float32)


def reciprocal(s: jax.Array) -> jax.Array:
    """1 / s as the backend computes it: an estimate, never a decision. XLA:GPU's is correctly
    rounded for only 87% of values; every caller settles its answer with exact comparisons
    that hold whatever this estimate's last few bits (tests perturb it by +-2 ulps)."""
    return 1.0 / s


def significant_bits(value: float) -> int:
    """Significant bits of a positive float (a grid value such as elem_max)."""
    m, _ = math.frexp(value)
    bits = 0
    while m:
        m, bits = (m * 2) % 1, bits + 1
    return bits


def split(s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """s = head + tail exactly, head holding s's top 12 significant bits."""
    head = lax.bitcast_convert_type(
        lax.bitcast_convert_type(s, jnp.uint32) & jnp.uint32(0xFFFFF000), jnp.float32)
    return head, s - head


def split_up(s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """s = head + tail exactly, head s rounded up to 12 significant bits, so tail <= 0 (with
    |tail| below head's last bit): n head and n tail are exact for n of at most 12 bits, and
    for n = floor(a / s) so is a - n head (it lies in (-s, s), a multiple of s's last bit)."""
    bits = lax.bitcast_convert_type(s, jnp.uint32)
    head = lax.bitcast_convert_type((bits + 0xFFF) & jnp.uint32(0xFFFFF000), jnp.float32)
    return head, s - head


def tiny_exponent(fmt: Format) -> int:
    """The tiny-block threshold as a biased f32 exponent (the spec's `tiny_exponent`): a block
    is tiny when its amax's exponent field is below emax_elem + 2 - g, 2^g the grid's smallest
    positive value, so that every value any other block dequantizes to is a normal f32."""
    g = 0 if fmt.is_int else fmt.min_exponent - fmt.mant_bits
    return fmt.emax_elem + 2 - g


def is_tiny(amax: jax.Array, fmt: Format) -> jax.Array:
    """amax (non-negative, or NaN) below the format's tiny threshold: read off its exponent
    bits, an integer comparison that no flushing of subnormals can change."""
    return lax.bitcast_convert_type(amax, jnp.int32) >> 23 < tiny_exponent(fmt)


def _lift(amax: jax.Array) -> jax.Array:
    """A power of two per block that lifts a tiny block (amax < 2^-60) by 2^64, else 1.

    The exact comparisons subtract nearly equal numbers; near f32's smallest normal
    (1.2e-38) the difference would be subnormal and XLA:CPU flushes it to zero, turning a
    near-tie into a false tie. Scaling both sides by the same power of two changes no ratio.
    """
    return jnp.where(amax < 2.0**-60, jnp.float32(2.0**64), jnp.float32(1.0))


def range_factor(s: jax.Array, fmt: Format) -> jax.Array:
    """A power of two per block bringing its f32 scale s into range for the exact comparisons:
    2^64 for a tiny block (s * elem_max < 2^-60: `_lift`), 2^-64 for a huge one (s > 2^64,
    whose reciprocal would be subnormal, flushed to zero, past 2^126), else 1. Values that
    2^-64 flushes (|x| < 2^-62) are below 2^-126 s, so they round to zero either way."""
    return jnp.where(s > 2.0**64, jnp.float32(2.0**-64), _lift(s * fmt.elem_max))


def product_vs(coef, s: tuple[jax.Array, jax.Array], a: jax.Array) -> jax.Array:
    """sign(coef * s - a), exactly, for s = `split(s)`, a >= 0 and coef with <= 12 bits.

    f32 cannot hold coef * s, so s comes split into a 12-bit head and its exact tail; both
    partial products are exact, and the head term lies within a factor 2 of `a` whenever the
    answer is close, where the subtraction is exact too (Sterbenz). XLA cannot spoil this: it
    never reassociates float sums, and fusing a multiply-add only removes a rounding.
    """
    head, tail = s
    return jnp.sign((coef * head - a) + coef * tail)


def _round_up(s: jax.Array, dtype) -> jax.Array:
    """Round positive f32 `s` to `dtype`, upwards (never below s)."""
    r = s.astype(dtype)
    return jnp.where(r.astype(jnp.float32) < s, _step(r, up=True), r)


def _step(s: jax.Array, up: bool) -> jax.Array:
    """The next representable value above (or below, towards 0) positive s, in s's dtype,
    by stepping its bit pattern (cheaper than nextafter, which XLA:CPU emulates for bf16)."""
    uint = jnp.uint16 if s.dtype == jnp.bfloat16 else jnp.uint32
    bits = lax.bitcast_convert_type(s, uint)
    if uint == jnp.uint16:  # 32-bit arithmetic: Mosaic has no 16-bit compares
        bits = bits.astype(jnp.int32)
    stepped = bits + 1 if up else jnp.where(bits > 0, bits - 1, bits)
    finite = jnp.isfinite(s.astype(jnp.float32))  # f32: Mosaic has no isfinite for bf16
    return jnp.where(finite, lax.bitcast_convert_type(stepped.astype(uint), s.dtype), s)


def block_scales(amax: jax.Array,
                 fmt: Format) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Per block: (stored scale, scale as f32, None) for bf16/f32 scales; (E8M0 code, None,
    the exact power of two taking x to element units) for MX."""
    finite = jnp.isfinite(amax)
    tiny = is_tiny(amax, fmt)  # the all-zero block among them
    if fmt.scale_dtype == "e8m0":
        # amax in [2^(e-1), 2^e) and elem_max in [2^f, 2^(f+1)), f = emax_elem.
        _, e = jnp.frexp(amax)
        f = fmt.emax_elem
        if fmt.scale_rule == "floor":  # OCP MX v1.0: floor(log2 amax) - emax_elem, may clip
            k = jnp.where(tiny, -E8M0_BIAS, jnp.clip(e - 1 - f, -E8M0_BIAS, 127))
        else:  # k = ceil(log2(amax / elem_max)), exactly: k in {e-f-1, e-f}, one comparison
            k = jnp.clip(e - f - 1, -E8M0_BIAS, 126)
            k = jnp.where(amax * pow2(-k) > fmt.elem_max, k + 1, k)
            k = jnp.where(tiny, -E8M0_BIAS, jnp.clip(k, -E8M0_BIAS, 126))
        code = jnp.where(finite, k + E8M0_BIAS, 255).astype(jnp.uint8)  # 255 is E8M0's NaN
        inv = jnp.where(finite, pow2(jnp.clip(-k, -126, 127)), jnp.nan)
        inv = jnp.where(tiny, 0.0, inv)  # a tiny block's payload is zero
        return code, None, inv
    # The smallest scale-dtype value s with s * elem_max >= amax. Estimate it (XLA multiplies
    # by fl(1 / elem_max), a hair off), then step down while the step below still covers amax
    # and up while s does not. The estimate is within a few f32 ulps of amax / elem_max (two,
    # and two more if the reciprocal's last bits are off, as XLA:GPU's may be): one step each
    # way for a bf16 scale (its steps are 2^16 ulps), four for an f32 scale.
    # (Under jax 0.12, XLA:CPU recomputes these per-block operations for every element of the
    # block inside the quantizer's loop, so their number matters.)
    dtype = jnp.dtype(fmt.scale_dtype)

    lift = _lift(amax)
    bf16 = fmt.scale_dtype == "bfloat16" and significant_bits(fmt.elem_max) + 8 <= 24

    def covers(s):  # s * elem_max >= amax, exactly
        s = s.astype(jnp.float32) * lift
        if bf16:  # 8 + at most 16 significant bits: the product is exact (or inf, past amax)
            return s * fmt.elem_max >= amax * lift
        return product_vs(fmt.elem_max, split(s), amax * lift) >= 0

    # (a NaN/inf amax gives a NaN/inf scale)
    s = _round_up(amax * reciprocal(jnp.float32(fmt.elem_max)), dtype)
    for _ in range(1 if bf16 else 4):
        s = jnp.where(covers(_step(s, up=False)), _step(s, up=False), s)
    for _ in range(1 if bf16 else 4):
        s = jnp.where(covers(s) | ~finite, s, _step(s, up=True))
    # Near f32's maximum the grid's top value times that scale passes 3.4e38, where the exact
    # rounding cannot compare: take one step down, the largest scale whose top stays finite
    # (the block's largest elements then saturate to elem_max; module essay).
    big = np.finfo(np.float32).max
    if bf16:  # exact product, or inf past f32's maximum
        past = s.astype(jnp.float32) * fmt.elem_max > big
    else:
        past = product_vs(fmt.elem_max, split(s.astype(jnp.float32)), big) > 0
    s = jnp.where(past, _step(s, up=False), s)
    # A tiny block (decided on amax's exponent bits, never on a flushed product) stores 0.
    s = jnp.where(tiny, jnp.zeros((), dtype), s)
    return s, s.astype(jnp.float32), None


def scaled(values: jax.Array, stored: jax.Array, fmt: Format,
           expand=lambda a: a[..., None]) -> jax.Array:
    """values * scale in f32, unsaturated: E8M0 scales applied as two exact powers of two, a
    non-finite block (E8M0 code 255) NaN. `expand` broadcasts a per-block array against the
    values (blocks along the last axis by default)."""
    if fmt.scale_dtype == "e8m0":
        k = stored.astype(jnp.int32) - E8M0_BIAS
        half = k // 2
        out = values * expand(pow2(half)) * expand(pow2(k - half))
        return jnp.where(expand(stored == 255), jnp.nan, out)
    return values * expand(stored.astype(jnp.float32))


def apply_scale(values: jax.Array, stored: jax.Array, fmt: Format,
                expand=lambda a: a[..., None]) -> jax.Array:
    """values * scale in f32 (`scaled`), saturated to f32's finite range (a finite block stays
    finite).

    Saturation only matters for a block near f32's maximum, whose largest element can round to
    a grid value just past it; the saturated value is still within half a step of the input.
    Non-finite blocks stay NaN (a clip keeps a NaN under XLA; the GPU codec, whose Triton min
    and max would drop it, saturates by comparisons: kernels/gpu.py).
    """
    big = np.finfo(np.float32).max
    return jnp.clip(scaled(values, stored, fmt, expand), -big, big)
