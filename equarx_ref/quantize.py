"""Block-wise quantization: float values to packed elements and one scale per block, and back.

For each block of `B` consecutive values (a `Format` fixes B, the element grid and the scale type):

    amax  = max |x|                                   over the block, in f32
    scale = the smallest scale-dtype value s with s * elem_max >= amax   (so nothing clips)
    q     = round(x / s)  onto the element grid       (nearest, ties to even; or stochastic)
    x'    = q * s                                     (dequantize, in f32)

Both rules hold exactly, under `jit` and eagerly alike. That takes care: XLA turns a division by
a constant or a broadcast into a multiplication by a rounded reciprocal, which can land one
scale step too high or on the wrong side of a rounding tie. So the quantizer estimates with the
reciprocal and then settles every close call with exact comparisons: with a bf16 scale (8
significant bits) a midpoint times the scale, (q +- 1/2) s, is exact in f32, so a plain
comparison with x decides; an f32 scale is split into two halves first (`_split`).

Error. For integer grids the step is `s`, so round-to-nearest is off by at most s/2 and
stochastic rounding by less than one step, with zero mean. For float grids (fp8, fp4) the step
depends on the element's binade: the error is at most half an ULP of the element format. Scales
are rounded up to their dtype: a bf16 scale is at most 2^-7 (relative) above amax / elem_max,
which is all the precision a coarse scale costs. The error model built on these bounds is in
models/error.py.

MX formats use a power-of-two scale 2^k stored as an E8M0 byte k + 127: by default
k = ceil(log2(amax / elem_max)), so nothing clips; with `scale_rule="floor"` OCP MX v1.0's
k = floor(log2(amax)) - emax_elem, and the elements that land above elem_max saturate to it
(see formats.py for the trade-off).

Edge cases, all deliberate:
- An all-zero block has scale 0 (E8M0: the smallest exponent, 2^-127) and a zero payload, and
  dequantizes to exact zeros.
- A block whose amax / elem_max falls below f32's smallest normal number (~1.2e-38, so amax below
  ~1.5e-36 for int8) gets a zero scale, because XLA:CPU flushes subnormal floats to zero; it
  dequantizes to zeros. That is an absolute error under 1.5e-36, tested, and far below any
  activation that matters. E8M0 scales reach 2^-127 and keep such blocks.
- A finite block near f32's maximum stays finite and within the format's bound. Where the
  covering scale s would put the grid's top value past f32's maximum (s * elem_max > 3.4e38),
  the scale is the step below it instead, the largest whose top value is finite, and elements
  past s * elem_max saturate to elem_max: they lose under one scale step times elem_max, which
  for amax = 3.4028e38 is 0.19% (bf16 scales: int4, fp8) or 0.006% (int8), far inside half a
  grid step. Dequantizing also saturates to the largest f32, so nothing finite becomes inf.
- A NaN or infinity in a block makes its amax, hence its scale, non-finite (NaN is checked for
  explicitly: XLA:CPU's vectorised max reduction can drop it); the payload of such a
  block is forced to 0 (casting NaN to an integer is undefined, and e4m3 would turn overflow into
  NaN), so the block dequantizes to 0 * inf = NaN: non-finite, whatever the payload. Other blocks
  are untouched.

Packing. A block's payload is its elements' codes (two's complement for integer grids, sign |
exponent | mantissa for float grids), packed: 4-bit elements two per byte, element i of a block
in the low nibble of byte i and element i + B/2 in its high nibble; 8-bit ones a byte each;
other widths one little-endian bit stream per block, element i in bits [i N, (i + 1) N). How a
block's payload and scale travel as one uint8 buffer, and the codec the collectives send
messages with, are in wire.py.

Speed. Quantizing is compute bound on a CPU: its cost is the operations per element, and
XLA:CPU's fusion decides how many there are. Measured: CPU time, 4M values,
quantize + dequantize under one jit, the least of 5 calls interleaved across formats.
(1) The cause of int4's regression: `dequantize` unpacked 4-bit elements as a concatenation
of the two nibble halves, and XLA fused the whole quantizer and its nibble-packing reduction
into that concatenation (one fusion of 245 operations), a loop that jax 0.10.2's XLA:CPU
runs about ten times slower per element: int4 9.7x int8's time, int4/f32 and fp4 12x (jax
0.12 builds the same fusion and runs it at 0.7x). So `dequantize` unpacks through a broadcast, which
keeps the packing out: int4 0.9x on the old code with only that changed. `decode` (wire.py: bytes
off the wire, no quantizer to fuse) keeps the concatenation. (2) XLA fuses cheap per-block
operations into the per-element loop that reads them through a broadcast, so the scale
search (estimate, exact steps, `_norm`, 1/s) ran again for every element of its block: an
exact integer division by a per-block 1 that XLA cannot fold (`_once`) makes it compute the
scale once (int8 10-12 ms -> 5-6 ms, int4/f32 22 -> 6 ms, both jax versions). (3) The
rounding compares x with one midpoint only, a plain product for bf16 scales, and reads the
codes off the rounded units directly (`_nearest_codes`). All three: int8 22.5 -> 5.7 ms,
int4 219 -> 5.5 ms (jax 0.10.2); int8 32 -> 5.3 ms, int4 23 -> 5.3 ms (jax 0.12).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from .formats import Format

__all__ = ["Quantized", "dequantize", "quantize"]

_E8M0_BIAS = 127


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Quantized:
    """A quantized array: packed payload, one scale per block, and what it came from.

    Attributes:
        payload: uint8 `[..., blocks, payload_bytes_per_block]`.
        scales: one per block `[..., blocks]`: bf16 or f32 values, or uint8 E8M0 codes (MX).
        shape: the original shape (static).
        dtype: the original dtype name (static).
        fmt: the `Format` (static).
    """

    payload: jax.Array
    scales: jax.Array
    shape: tuple[int, ...] = dataclasses.field(metadata={"static": True})
    dtype: str = dataclasses.field(metadata={"static": True})
    fmt: Format = dataclasses.field(metadata={"static": True})

    @property
    def nbytes(self) -> int:
        """Bytes of payload and scales, as `to_bytes` lays them out."""
        return int(self.payload.size + self.scales.size * self.fmt.scale_bytes)


# ---- small exact helpers -------------------------------------------------------------------


def _pow2(k: jax.Array) -> jax.Array:
    """2.0**k in f32, exact, for integer k in [-126, 127] (built from the exponent bits)."""
    return lax.bitcast_convert_type(((k + 127) << 23).astype(jnp.int32), jnp.float32)


def _check_float(x: Any, what: str) -> jax.Array:
    try:
        x = jnp.asarray(x)
    except (TypeError, ValueError):
        raise TypeError(f"{what} takes an array x (jax, numpy or a float), got "
                        f"{type(x).__name__}") from None
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{what} needs a floating-point array x, got dtype {x.dtype}; "
                        "cast integers to a float dtype first")
    return x


# ---- exact comparisons ----------------------------------------------------------------------


def _split(s: jax.Array) -> tuple[jax.Array, jax.Array]:
    """s = head + tail exactly, head holding s's top 12 significant bits."""
    head = lax.bitcast_convert_type(
        lax.bitcast_convert_type(s, jnp.uint32) & jnp.uint32(0xFFFFF000), jnp.float32)
    return head, s - head


def _lift(amax: jax.Array) -> jax.Array:
    """A power of two per block that lifts a tiny block (amax < 2^-60) by 2^64, else 1.

    The exact comparisons below subtract nearly equal numbers; near f32's smallest normal
    (1.2e-38) the difference would be subnormal and XLA:CPU flushes it to zero, turning a
    near-tie into a false tie. Scaling both sides by the same power of two changes no ratio.
    """
    return jnp.where(amax < 2.0**-60, jnp.float32(2.0**64), jnp.float32(1.0))


def _norm(s: jax.Array, fmt: Format) -> jax.Array:
    """A power of two per block bringing its f32 scale s into range for the exact comparisons:
    2^64 for a tiny block (s * elem_max < 2^-60: `_lift`), 2^-64 for a huge one (s > 2^64,
    whose reciprocal would be subnormal, flushed to zero, past 2^126), else 1. Values that
    2^-64 flushes (|x| < 2^-62) are below 2^-126 s, so they round to zero either way."""
    return jnp.where(s > 2.0**64, jnp.float32(2.0**-64), _lift(s * fmt.elem_max))


def _product_vs(coef, s: tuple[jax.Array, jax.Array], a: jax.Array) -> jax.Array:
    """sign(coef * s - a), exactly, for s = `_split(s)`, a >= 0 and coef with <= 12 bits.

    f32 cannot hold coef * s, so s comes split into a 12-bit head and its exact tail; both
    partial products are exact, and the head term lies within a factor 2 of `a` whenever the
    answer is close, where the subtraction is exact too (Sterbenz). XLA cannot spoil this: it
    never reassociates float sums, and fusing a multiply-add only removes a rounding.
    """
    head, tail = s
    return jnp.sign((coef * head - a) + coef * tail)


# ---- scales --------------------------------------------------------------------------------


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


def _scales(amax: jax.Array, fmt: Format) -> tuple[jax.Array, jax.Array | None, jax.Array | None]:
    """Per block: (stored scale, scale as f32, None) for bf16/f32 scales; (E8M0 code, None,
    the exact power of two taking x to element units) for MX."""
    finite = jnp.isfinite(amax)
    if fmt.scale_dtype == "e8m0":
        # amax in [2^(e-1), 2^e) and elem_max in [2^f, 2^(f+1)), f = emax_elem.
        _, e = jnp.frexp(amax)
        f = fmt.emax_elem
        if fmt.scale_rule == "floor":  # OCP MX v1.0: floor(log2 amax) - emax_elem, may clip
            k = jnp.where(amax > 0, jnp.clip(e - 1 - f, -_E8M0_BIAS, 127), -_E8M0_BIAS)
        else:  # k = ceil(log2(amax / elem_max)), exactly: k in {e-f-1, e-f}, one comparison
            k = jnp.clip(e - f - 1, -_E8M0_BIAS, 126)
            k = jnp.where(amax * _pow2(-k) > fmt.elem_max, k + 1, k)
            k = jnp.where(amax > 0, jnp.clip(k, -_E8M0_BIAS, 126), -_E8M0_BIAS)
        code = jnp.where(finite, k + _E8M0_BIAS, 255).astype(jnp.uint8)  # 255 is E8M0's NaN
        inv = jnp.where(finite, _pow2(jnp.clip(-k, -126, 127)), jnp.nan)
        return code, None, inv
    # The smallest scale-dtype value s with s * elem_max >= amax. Estimate it (XLA multiplies
    # by fl(1 / elem_max), a hair off), then step down while the step below still covers amax
    # and up while s does not. The estimate is within two f32 ulps of amax / elem_max: one
    # step each way for a bf16 scale (its steps are 2^16 ulps), two for an f32 scale.
    # (Under jax 0.12, XLA:CPU recomputes these per-block operations for every element of the
    # block inside the quantizer's loop, so their number matters.)
    dtype = jnp.dtype(fmt.scale_dtype)

    lift = _lift(amax)
    bf16 = fmt.scale_dtype == "bfloat16" and _bits(fmt.elem_max) + 8 <= 24

    def covers(s):  # s * elem_max >= amax, exactly
        s = s.astype(jnp.float32) * lift
        if bf16:  # 8 + at most 16 significant bits: the product is exact (or inf, past amax)
            return s * fmt.elem_max >= amax * lift
        return _product_vs(fmt.elem_max, _split(s), amax * lift) >= 0

    s = _round_up(amax * (1.0 / fmt.elem_max), dtype)  # NaN/inf amax gives a NaN/inf scale
    for _ in range(1 if bf16 else 2):
        s = jnp.where(covers(_step(s, up=False)), _step(s, up=False), s)
    for _ in range(1 if bf16 else 2):
        s = jnp.where(covers(s) | ~finite, s, _step(s, up=True))
    # Near f32's maximum the grid's top value times that scale passes 3.4e38, where the exact
    # rounding cannot compare: take one step down, the largest scale whose top stays finite
    # (the block's largest elements then saturate to elem_max; module essay).
    big = np.finfo(np.float32).max
    if bf16:  # exact product, or inf past f32's maximum
        past = s.astype(jnp.float32) * fmt.elem_max > big
    else:
        past = _product_vs(fmt.elem_max, _split(s.astype(jnp.float32)), big) > 0
    s = jnp.where(past, _step(s, up=False), s)
    # Below f32's smallest normal, XLA:CPU would flush the scale anyway: store an exact zero.
    s = jnp.where(s.astype(jnp.float32) < np.finfo(np.float32).tiny, jnp.zeros((), dtype), s)
    return s, s.astype(jnp.float32), None


def apply_scale(values: jax.Array, stored: jax.Array, fmt: Format) -> jax.Array:
    """values * scale in f32, saturated to f32's finite range (a finite block stays finite).

    E8M0 scales are applied as two exact powers of two. Saturation only matters for a block
    near f32's maximum, whose largest element can round to a grid value just past it; the
    saturated value is still within half a step of the input. Non-finite blocks stay NaN.
    """
    if fmt.scale_dtype == "e8m0":
        k = stored.astype(jnp.int32) - _E8M0_BIAS
        half = k // 2
        out = values * _pow2(half)[..., None] * _pow2(k - half)[..., None]
        out = jnp.where((stored == 255)[..., None], jnp.nan, out)
    else:
        out = values * stored.astype(jnp.float32)[..., None]
    big = np.finfo(np.float32).max
    return jnp.clip(out, -big, big)


# ---- rounding onto the element grid ----------------------------------------------------------


def _ulp_exponent(q: jax.Array, fmt: Format) -> jax.Array:
    """k with 2^k the spacing of a float grid at |q| (the subnormal range shares the lowest)."""
    e = (lax.bitcast_convert_type(q, jnp.int32) >> 23 & 0xFF) - 127  # |q| in [2^e, 2^(e+1))
    return jnp.maximum(e, fmt.min_exponent) - fmt.mant_bits


def _bits(value: float) -> int:
    """Significant bits of a positive float (a grid value such as elem_max)."""
    m, _ = math.frexp(value)
    bits = 0
    while m:
        m, bits = (m * 2) % 1, bits + 1
    return bits


def _midpoint_bits(fmt: Format) -> int:
    """Significant bits of a midpoint n +- 1/2 in units of the grid's spacing: |n| < 2^(bits-1)
    for integers; n <= 2^(m+1) for a float grid with m mantissa bits (its binade's top)."""
    return fmt.elem_bits if fmt.is_int else fmt.mant_bits + 3


def _nearest_codes(x: jax.Array, v: jax.Array, s: jax.Array, fmt: Format) -> jax.Array:
    """round(x / s) to the nearest grid value, ties to even, exactly; its int32 code.

    `v = x * fl(1/s)` is the quantizer's fast estimate, within a few f32 ulps of x / s. In
    units u of the grid's spacing at v (1 for integers, 2^k in v's binade for floats) it
    rounds to n = round(v / u); that can sit on the wrong side of a midpoint by a rounding,
    never further, and only of the midpoint nearest to v / u: m = n + h, h = +1/2 if v / u
    >= n, else -1/2. So one exact comparison of x with m u s decides whether n moves by one
    (towards m; on m itself only from an odd n, ties to even). Signed values throughout:

    - bf16 scale (8 significant bits): m has at most `_midpoint_bits` bits, so m u s is exact
      in f32 and a plain comparison with x settles it;
    - f32 scale (24 bits): s is split into head + tail (`_split`); r = x - n u head is exact
      (Sterbenz), and so is the sign of (r - h u head) - m u tail.

    A float grid's spacing halves below a power of two, but the midpoint there is a quarter
    step away from v's estimate, which an estimate this close never crosses: only the
    midpoints of v's own binade can be in doubt. x and s come scaled by `_norm`, so that no
    product or difference below is subnormal.

    The code is read off n and k directly: an integer's is n; a float's magnitude is
    (k - k_min) 2^mant_bits + n (n counts the hidden bit, and n = 2^(mant_bits+1) carries
    into the next binade, as the code does), its sign bit x's, also at zero (-0).
    """
    v = jnp.clip(v, -fmt.elem_max, fmt.elem_max)
    if fmt.is_int:
        w, unit = v, None
    else:  # unit = 2^k = max(2^e, 2^emin) 2^-m for |v| in [2^e, 2^(e+1)); 1/unit from its bits
        top = lax.bitcast_convert_type(lax.bitcast_convert_type(v, jnp.int32) & 0x7F800000,
                                       jnp.float32)  # 2^e (0 for v = 0)
        unit = jnp.maximum(top, 2.0**fmt.min_exponent) * 2.0**-fmt.mant_bits
        ubits = lax.bitcast_convert_type(unit, jnp.int32)
        w = v * lax.bitcast_convert_type(0x7F000000 - ubits, jnp.float32)  # exact
    n = jnp.round(w)
    h = jnp.where(w >= n, 0.5, -0.5)  # towards the midpoint nearest to the estimate
    # a zero scale (all-zero or flushed block) or a non-finite one keeps n: no comparison with
    # an infinite scale holds (it gives +-inf, or NaN where n = 0)
    S = jnp.where(s > 0, s, jnp.inf)
    if fmt.scale_dtype == "bfloat16" and _midpoint_bits(fmt) + 8 <= 24:
        mid = (n + h) * (S if unit is None else S * unit)  # exact (or +-inf beyond f32)
        beyond = ((h > 0) & (x > mid)) | ((h < 0) & (x < mid))  # no select of masks: Mosaic
        tie = x == mid
    else:
        head, tail = _split(S)
        if unit is not None:
            head, tail = head * unit, tail * unit  # exact
        d = ((x - n * head) - h * head) - (n + h) * tail  # the sign of x - m u s, exact
        beyond = ((h > 0) & (d > 0)) | ((h < 0) & (d < 0))
        tie = d == 0
    c = n.astype(jnp.int32)
    c = c + jnp.where(beyond | (tie & ((c & 1) == 1)), jnp.where(h > 0, 1, -1), 0)
    if unit is None:  # a block near f32's maximum, its scale stepped down (`_scales`), may
        # put x past (elem_max + 1/2) s: it saturates to +-elem_max. (A float grid's top
        # midpoint is at least 1/32 beyond elem_max, past one bf16 scale step: never crossed.)
        return jnp.clip(c, -int(fmt.elem_max), int(fmt.elem_max))
    kmin_bits = (127 + fmt.min_exponent - fmt.mant_bits) << 23  # unit's bits at k_min
    mag = ((ubits - kmin_bits) >> (23 - fmt.mant_bits)) + jnp.abs(c)
    return jnp.where(jnp.signbit(x), mag | 1 << (fmt.elem_bits - 1), mag)


def _round_to_grid(v: jax.Array, fmt: Format, key: jax.Array | None) -> jax.Array:
    """Round element-unit values |v| <= elem_max onto the format's grid (f32 result)."""
    v = jnp.clip(v, -fmt.elem_max, fmt.elem_max)
    k = None if fmt.is_int else _ulp_exponent(v, fmt)
    r = v if k is None else v * _pow2(-k)  # exact: a power of two
    if key is None:
        r = jnp.round(r)  # round half to even
    else:
        r = jnp.floor(r + jax.random.uniform(key, r.shape, jnp.float32))
    r = r if k is None else r * _pow2(k)
    return jnp.clip(r, -fmt.elem_max, fmt.elem_max)


def _float_codes(q: jax.Array, fmt: Format) -> jax.Array:
    """Grid values of a float element (sign | exponent | mantissa, bias 1 - emin) -> int32 codes.

    Read off q's f32 bits: the same code XLA's f32 -> fp8 cast gives for a value on the grid,
    in a few integer operations (XLA:CPU converts fp8 slowly), and the only route for fp4.
    """
    m, emin = fmt.mant_bits, fmt.min_exponent
    bits = lax.bitcast_convert_type(jnp.abs(q), jnp.int32)
    e = (bits >> 23 & 0xFF) - 127
    normal = e >= emin
    mant = jnp.where(normal, bits >> (23 - m) & ((1 << m) - 1),
                     (jnp.abs(q) * _pow2(jnp.asarray(m - emin))).astype(jnp.int32))
    sign = jnp.signbit(q).astype(jnp.int32) << (fmt.elem_bits - 1)
    return sign | jnp.where(normal, e - emin + 1, 0) << m | mant


def _float_values(c: jax.Array, fmt: Format) -> jax.Array:
    """Inverse of `_float_codes`: int32 codes -> f32 grid values. A normal code's bits, moved
    to f32's exponent and mantissa fields and rebiased, are the value; a subnormal code's
    mantissa counts steps of 2^(emin - m)."""
    m, emin = fmt.mant_bits, fmt.min_exponent
    mag = c & ((1 << (fmt.elem_bits - 1)) - 1)
    normal = lax.bitcast_convert_type((mag << (23 - m)) + ((126 + emin) << 23), jnp.float32)
    mag = jnp.where(mag >= 1 << m, normal, mag.astype(jnp.float32) * 2.0 ** (emin - m))
    return jnp.where(c >> (fmt.elem_bits - 1) & 1 == 1, -mag, mag)


def _group(bits: int) -> tuple[int, int]:
    """(elements, bytes) of the smallest whole-byte group of `bits`-bit codes: 4 codes of 6
    bits fill 3 bytes."""
    g = 8 // math.gcd(bits, 8)
    return g, g * bits // 8


def _pack_bits(codes: jax.Array, bits: int) -> jax.Array:
    """Codes [..., B] (each < 2^bits) -> one little-endian bit stream, uint8 [..., B bits / 8]:
    element i occupies bits [i bits, (i + 1) bits) of the block's payload.

    Where a group of codes fits 32 bits (2, 3, 6 and 12 bits), each group becomes one int32
    word and the word its bytes: 32-bit shifts and a reshape that keeps the block axis, which
    Mosaic compiles. Other widths go through a [bits x elements] bit matrix (XLA only)."""
    g, nb = _group(bits)
    if g * bits <= 32:
        groups = codes.reshape(*codes.shape[:-1], -1, g)  # [..., B / g, g]
        word = groups[..., 0]
        for r in range(1, g):
            word = word | groups[..., r] << (bits * r)
        out = jnp.stack([word >> (8 * r) & 0xFF for r in range(nb)], axis=-1)
        return out.reshape(*codes.shape[:-1], -1).astype(jnp.uint8)
    stream = (codes[..., None] >> jnp.arange(bits, dtype=jnp.int32)) & 1  # [..., B, bits]
    stream = stream.reshape(*codes.shape[:-1], -1, 8)  # [..., bytes, 8]
    return jnp.sum(stream << jnp.arange(8, dtype=jnp.int32), axis=-1).astype(jnp.uint8)


def _unpack_bits(payload: jax.Array, bits: int) -> jax.Array:
    """Inverse of `_pack_bits`: uint8 [..., PB] -> int32 codes [..., PB * 8 / bits]."""
    g, nb = _group(bits)
    if g * bits <= 32:
        raw = payload.astype(jnp.int32).reshape(*payload.shape[:-1], -1, nb)  # [..., B/g, nb]
        word = raw[..., 0]
        for r in range(1, nb):
            word = word | raw[..., r] << (8 * r)
        codes = jnp.stack([word >> (bits * r) & ((1 << bits) - 1) for r in range(g)], axis=-1)
        return codes.reshape(*payload.shape[:-1], -1)
    stream = (payload.astype(jnp.int32)[..., None] >> jnp.arange(8, dtype=jnp.int32)) & 1
    stream = stream.reshape(*payload.shape[:-1], -1, bits)  # [..., B, bits]
    return jnp.sum(stream << jnp.arange(bits, dtype=jnp.int32), axis=-1)


def encode_elements(q: jax.Array, fmt: Format) -> jax.Array:
    """Grid values [..., B] -> packed uint8 [..., B * elem_bits / 8]."""
    return _pack_codes(q.astype(jnp.int32) if fmt.is_int else _float_codes(q, fmt), fmt)


def _pack_codes(codes: jax.Array, fmt: Format) -> jax.Array:
    """int32 codes [..., B] (two's complement for integers) -> packed uint8 [..., PB]."""
    codes = codes & ((1 << fmt.elem_bits) - 1)
    if fmt.elem_bits == 8:
        return codes.astype(jnp.uint8)
    if fmt.elem_bits == 4:
        # element i in the low nibble, element i + B/2 in the high one. Written as a sum over
        # the two halves (a reduction), not as `lo | hi << 4` of two slices: XLA:CPU fuses the
        # whole quantizer into the slices' strided reads, 7-14x slower (measured: int4 encode
        # of a dynamically sliced 4M values 107 ms, as a reduction 7 ms, one core). The shifts
        # are an iota, not an array constant: a Pallas kernel (kernels/hop.py) may not capture
        # constants.
        halves = codes.astype(jnp.int32).reshape(*codes.shape[:-1], 2, -1)
        shifts = 4 * lax.broadcasted_iota(jnp.int32, (2, 1), 0)  # [[0], [4]]
        return jnp.sum(halves << shifts, axis=-2).astype(jnp.uint8)
    return _pack_bits(codes, fmt.elem_bits)


def decode_elements(payload: jax.Array, fmt: Format, *, from_wire: bool = True) -> jax.Array:
    """Packed uint8 [..., PB] -> grid values f32 [..., B].

    4-bit elements: byte i holds elements i (low nibble) and i + B/2 (high nibble). Two ways to
    unpack them, for XLA:CPU's sake (jax 0.10; measured, "Speed" in the module essay):
    `from_wire` bytes (decode: they arrive from a collective) as a concatenation of the two
    nibble halves, which XLA materialises once so that every consumer reads plain bytes;
    bytes fresh from `quantize` in the same jit (dequantize) through a broadcast, which keeps
    XLA from fusing the nibble-packing reduction, and with it the whole quantizer, into the
    unpacking, which jax 0.10.2 runs about ten times slower (int4 9.7x int8).
    """
    if fmt.elem_bits == 4 and from_wire:  # widened first: Mosaic (older libtpu) has no 8-bit shifts
        wide = payload.astype(jnp.int32)
        c = jnp.concatenate([wide & 0xF, wide >> 4], axis=-1)
    elif fmt.elem_bits == 4:
        shifts = 4 * lax.broadcasted_iota(jnp.int32, (2, 1), 0)  # [[0], [4]]
        c = (payload.astype(jnp.int32)[..., None, :] >> shifts) & 0xF  # [..., 2, B/2]
        c = c.reshape(*payload.shape[:-1], -1)
    elif fmt.elem_bits == 8:
        c = payload.astype(jnp.int32)
    else:
        c = _unpack_bits(payload, fmt.elem_bits)
    if fmt.is_int:  # two's complement of elem_bits bits
        sign = 1 << (fmt.elem_bits - 1)
        return ((c ^ sign) - sign).astype(jnp.float32)
    return _float_values(c, fmt)


# ---- public API ----------------------------------------------------------------------------


def _blocks(x: jax.Array, fmt: Format) -> jax.Array:
    """Flatten, zero-pad to whole blocks: [blocks, B] in f32."""
    flat = x.reshape(-1).astype(jnp.float32)
    pad = -flat.size % fmt.block_size
    return jnp.pad(flat, (0, pad)).reshape(-1, fmt.block_size)


def _once(a: jax.Array, amax: jax.Array) -> jax.Array:
    """The per-block f32 array `a`, unchanged, but computed once per block.

    XLA:CPU fuses cheap per-block operations into the per-element loop that reads them through
    a broadcast, so, unless a block's scale is also an output of its own, the whole scale
    search ran again for every element of the block (jax 0.10.2 and 0.12; "Speed" in the
    module essay). XLA never duplicates a division into a loop that reuses its elements: an
    exact integer division of a's bits by a per-block 1 (amax is never negative, NaN < 0 is
    false) that XLA cannot fold away makes the per-element loop read a stored array.
    """
    one = 1 + (amax < 0).astype(jnp.int32)
    return lax.bitcast_convert_type(lax.div(lax.bitcast_convert_type(a, jnp.int32), one),
                                    jnp.float32)


def quantize_blocks(xb: jax.Array, fmt: Format, key) -> tuple[jax.Array, jax.Array]:
    """[..., blocks, B] f32 -> (payload uint8 [..., blocks, PB], stored scales [..., blocks])."""
    amax = jnp.max(jnp.abs(xb), axis=-1)
    # XLA:CPU's vectorised max can drop a NaN (measured on jax 0.10.2: a [8, 8, 4, 32] max over
    # the last axis lost it), so NaN is detected on its own: it must decide the block.
    amax = jnp.where(jnp.isnan(xb).any(axis=-1), jnp.nan, amax)
    stored, s, inv = _scales(amax, fmt)
    finite = jnp.isfinite(amax)[..., None]
    xb = jnp.where(finite, xb, 0.0)  # a non-finite block is carried by its scale alone
    if s is None:
        inv = _once(inv, amax)[..., None]
        return encode_elements(_round_to_grid(jnp.where(finite, xb * inv, 0.0), fmt, key),
                               fmt), stored
    s = _once(s, amax)
    stored = s.astype(stored.dtype)  # exact: s is the stored scale's value
    norm = _norm(s, fmt)  # x and s scaled alike by a power of two: the same ratios
    s = s * norm
    inv = jnp.where(s > 0, 1.0 / s, 0.0)[..., None]
    xb, s = xb * norm[..., None], s[..., None]
    v = jnp.where(finite, xb * inv, 0.0)
    if key is not None:
        return encode_elements(_round_to_grid(v, fmt, key), fmt), stored
    return _pack_codes(_nearest_codes(xb, v, s, fmt), fmt), stored  # exact round(x / s)


def quantize(x: jax.Array, fmt: Format, *, key: jax.Array | None = None) -> Quantized:
    """Quantize `x` block-wise (any shape; flattened, zero-padded to whole blocks).

    Args:
        x: a floating-point array.
        fmt: the wire format, e.g. `Format.int8()`.
        key: a PRNG key for stochastic rounding (unbiased, error below one step); None rounds
            to nearest, ties to even.

    Returns:
        A `Quantized` pytree; `dequantize` restores an f32 array of `x`'s shape.

    Edge cases (module essay): an all-zero block comes back exact zeros; a block with a NaN or
    Inf comes back all NaN, other blocks untouched; a block whose largest magnitude is below
    about 1e-36 (int8; amax / elem_max under f32's smallest normal) comes back as zeros with
    bf16 or f32 scales, because XLA:CPU flushes subnormals, while E8M0 (MX) scales keep it;
    a finite block stays finite, even next to f32's maximum.
    """
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}")
    x = _check_float(x, "quantize")
    payload, stored = quantize_blocks(_blocks(x, fmt), fmt, key)
    return Quantized(payload, stored, tuple(x.shape), jnp.dtype(x.dtype).name, fmt)


def dequantize(q: Quantized) -> jax.Array:
    """The f32 values a `Quantized` stands for: `[*lead, *shape]`, lead the batch axes of a
    stacked `Quantized` (as `from_bytes` of a `[*lead, nbytes]` buffer gives)."""
    if not isinstance(q, Quantized):
        raise TypeError(f"dequantize takes q, the Quantized that quantize returns, got "
                        f"{type(q).__name__}")
    values = apply_scale(decode_elements(q.payload, q.fmt, from_wire=False), q.scales, q.fmt)
    lead = values.shape[:-2]
    n = math.prod(q.shape)
    return values.reshape(*lead, -1)[..., :n].reshape(*lead, *q.shape)
