"""Block-wise quantization: from float values to the bytes that travel, and back.

For each block of `B` consecutive values (a `Format` fixes B, the element grid and the scale type):

    amax  = max |x|                                   over the block, in f32
    scale = the smallest scale-dtype value s with s * elem_max >= amax   (so nothing clips)
    q     = round(x / s)  onto the element grid       (nearest, ties to even; or stochastic)
    x'    = q * s                                     (dequantize, in f32)

Both rules hold exactly, under `jit` and eagerly alike. That takes care: XLA turns a division by
a constant or a broadcast into a multiplication by a rounded reciprocal, which can land one
scale step too high or on the wrong side of a rounding tie. So the quantizer estimates with the
reciprocal and then settles every close call with exact comparisons (`_product_vs`).

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
- A finite block near f32's maximum stays finite: its largest element may round to a grid value
  just past 3.4e38, and dequantizing saturates it to the largest f32 (still within half a step).
- A NaN or infinity in a block makes its amax, hence its scale, non-finite (NaN is checked for
  explicitly: XLA:CPU's vectorised max reduction can drop it); the payload of such a
  block is forced to 0 (casting NaN to an integer is undefined, and e4m3 would turn overflow into
  NaN), so the block dequantizes to 0 * inf = NaN: non-finite, whatever the payload. Other blocks
  are untouched.

Wire layout. `to_bytes` lays out one uint8 buffer, block after block: each block's payload
(4-bit elements packed two per byte: element i of a block in the low nibble of byte i, element
i + B/2 in its high nibble; other widths as one little-endian bit stream per block, element i
in bits [i N, (i + 1) N)) followed by that block's scale bytes (the bf16/f32 bit pattern, or
the E8M0 byte). A collective sends exactly that buffer, so the bytes counted are the bytes sent.
Block-major keeps every block's bytes contiguous, so encoding is one pass that writes rows:
putting all payloads first and all scales after made XLA:CPU fuse the quantizer into a flat,
strided write, 15x slower for int4 (measured: 159 ms against 11 ms for 4M values, one core).

The wire codec. `Codec(fmt, dtype)` is what a collective sends per message: `encode`d blocks of
`fmt`, or with `fmt=None` the raw bits of `dtype` (a bf16 ring really sends 2 bytes per value),
and the accumulation dtype the receiver adds in (f32, or f64 for f64 inputs). The executor in
collectives.py and the Pallas kernels use this one codec, so both send the same bytes.
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

__all__ = [
    "Quantized",
    "decode",
    "dequantize",
    "encode",
    "from_bytes",
    "quantize",
    "to_bytes",
]

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
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise TypeError(f"{what} needs a floating-point array, got dtype {x.dtype}; "
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
    stepped = bits + 1 if up else jnp.where(bits > 0, bits - 1, bits)
    return jnp.where(jnp.isfinite(s), lax.bitcast_convert_type(stepped.astype(uint), s.dtype), s)


def _scales(amax: jax.Array, fmt: Format) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Per block: (stored scale, scale as f32, multiplier taking x to element units)."""
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
    # and up while s does not: two steps each way cover the estimate's error.
    dtype = jnp.dtype(fmt.scale_dtype)

    lift = _lift(amax)

    def covers(s):  # s * elem_max >= amax, exactly
        return _product_vs(fmt.elem_max, _split(s.astype(jnp.float32) * lift), amax * lift) >= 0

    s = _round_up(amax * (1.0 / fmt.elem_max), dtype)  # NaN/inf amax gives a NaN/inf scale
    for _ in range(2):
        s = jnp.where(covers(_step(s, up=False)), _step(s, up=False), s)
    for _ in range(2):
        s = jnp.where(covers(s) | ~finite, s, _step(s, up=True))
    # Below f32's smallest normal, XLA:CPU would flush the scale anyway: store an exact zero.
    s = jnp.where(s.astype(jnp.float32) < np.finfo(np.float32).tiny, jnp.zeros((), dtype), s)
    s32 = s.astype(jnp.float32)
    return s, s32, jnp.where(s32 > 0, 1.0 / s32, 0.0)


def _apply_scale(values: jax.Array, stored: jax.Array, fmt: Format) -> jax.Array:
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


def _neighbours(q: jax.Array, fmt: Format) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(below, above, odd) for grid values q >= 0: the neighbouring grid values (q itself at
    the grid's ends) and whether q's code is odd (its last mantissa bit; integers: q odd)."""
    if fmt.is_int:
        odd = q - 2 * jnp.floor(q * 0.5) == 1
        return jnp.maximum(q - 1, 0), jnp.minimum(q + 1, fmt.elem_max), odd
    k = _ulp_exponent(q, fmt)
    step = _pow2(k)
    # a normal power of two has the finer binade below it
    power = (lax.bitcast_convert_type(q, jnp.int32) & 0x7FFFFF == 0) & (q > 2.0**fmt.min_exponent)
    down = q - jnp.where(power, 0.5 * step, step)
    ratio = q * _pow2(-k)  # exact: q is a whole number of steps
    odd = ratio - 2 * jnp.floor(ratio * 0.5) == 1
    return jnp.maximum(down, 0), jnp.minimum(q + step, fmt.elem_max), odd


def _nearest_even(x: jax.Array, v: jax.Array, s: jax.Array, fmt: Format) -> jax.Array:
    """round(x / s) to the nearest grid value, ties to even, exactly; f32 result.

    `v = x * fl(1/s)` is the quantizer's fast estimate; it can sit on the wrong side of a
    midpoint by a rounding. So the remainder r = |x| - q s of the grid value q it gives is
    computed exactly (s split into head + tail: q * head and q * tail are exact, and
    |x| - q * head cancels exactly, Sterbenz) and compared with the half steps to both
    neighbours, h s: sign((r - h head) - (q + h) tail) is exact by the same argument.
    """
    lift = _lift(s * fmt.elem_max)[..., None]
    head, tail = _split(s[..., None] * lift)
    q = jnp.abs(_round_to_grid(v, fmt, None))
    down, up, odd = _neighbours(q, fmt)
    r = jnp.abs(x) * lift - q * head  # exact
    h_up, h_down = (up - q) * 0.5, (q - down) * 0.5  # half steps, exact
    above = jnp.sign((r - h_up * head) - (q + h_up) * tail)  # > 0: past the upper midpoint
    below = jnp.sign((r + h_down * head) - (q - h_down) * tail)  # < 0: under the lower one
    scaled = head > 0  # a zero scale (an all-zero or flushed block) keeps q = 0
    q = jnp.where(scaled & (up > q) & ((above > 0) | ((above == 0) & odd)), up, q)
    q = jnp.where(scaled & (down < q) & ((below < 0) | ((below == 0) & odd)), down, q)
    return jnp.where(jnp.signbit(x), -q, q)


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
    """Inverse of `_float_codes`: int32 codes -> f32 grid values."""
    m, emin = fmt.mant_bits, fmt.min_exponent
    e = c >> m & ((1 << (fmt.elem_bits - 1 - m)) - 1)
    mant = c & ((1 << m) - 1)
    significand = jnp.where(e > 0, mant + (1 << m), mant).astype(jnp.float32)
    mag = significand * _pow2(jnp.maximum(e, 1) - 1 + emin - m)
    return jnp.where(c >> (fmt.elem_bits - 1) & 1 == 1, -mag, mag)


def _pack_bits(codes: jax.Array, bits: int) -> jax.Array:
    """Codes [..., B] (each < 2^bits) -> one little-endian bit stream, uint8 [..., B bits / 8]:
    element i occupies bits [i bits, (i + 1) bits) of the block's payload."""
    stream = (codes[..., None] >> jnp.arange(bits, dtype=jnp.int32)) & 1  # [..., B, bits]
    stream = stream.reshape(*codes.shape[:-1], -1, 8)  # [..., bytes, 8]
    return jnp.sum(stream << jnp.arange(8, dtype=jnp.int32), axis=-1).astype(jnp.uint8)


def _unpack_bits(payload: jax.Array, bits: int) -> jax.Array:
    """Inverse of `_pack_bits`: uint8 [..., PB] -> int32 codes [..., PB * 8 / bits]."""
    stream = (payload.astype(jnp.int32)[..., None] >> jnp.arange(8, dtype=jnp.int32)) & 1
    stream = stream.reshape(*payload.shape[:-1], -1, bits)  # [..., B, bits]
    return jnp.sum(stream << jnp.arange(bits, dtype=jnp.int32), axis=-1)


def encode_elements(q: jax.Array, fmt: Format) -> jax.Array:
    """Grid values [..., B] -> packed uint8 [..., B * elem_bits / 8]."""
    codes = q.astype(jnp.int32) if fmt.is_int else _float_codes(q, fmt)
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


def decode_elements(payload: jax.Array, fmt: Format) -> jax.Array:
    """Packed uint8 [..., PB] -> grid values f32 [..., B]."""
    if fmt.elem_bits == 4:
        payload = jnp.concatenate([payload & 0xF, payload >> 4], axis=-1)
    if fmt.elem_bits in (4, 8):
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


def _quantize_blocks(xb: jax.Array, fmt: Format, key) -> tuple[jax.Array, jax.Array]:
    """[..., blocks, B] f32 -> (payload uint8 [..., blocks, PB], stored scales [..., blocks])."""
    amax = jnp.max(jnp.abs(xb), axis=-1)
    # XLA:CPU's vectorised max can drop a NaN (measured on jax 0.10.2: a [8, 8, 4, 32] max over
    # the last axis lost it), so NaN is detected on its own: it must decide the block.
    amax = jnp.where(jnp.isnan(xb).any(axis=-1), jnp.nan, amax)
    stored, s, inv = _scales(amax, fmt)
    finite = jnp.isfinite(amax)[..., None]
    xb = jnp.where(finite, xb, 0.0)  # a non-finite block is carried by its scale alone
    v = jnp.where(finite, xb * inv[..., None], 0.0)
    if key is None and s is not None:  # exact round(x / s); an E8M0 scale makes v exact already
        q = _nearest_even(xb, v, s, fmt)
    else:
        q = _round_to_grid(v, fmt, key)
    return encode_elements(q, fmt), stored


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
    payload, stored = _quantize_blocks(_blocks(x, fmt), fmt, key)
    return Quantized(payload, stored, tuple(x.shape), jnp.dtype(x.dtype).name, fmt)


def dequantize(q: Quantized) -> jax.Array:
    """The f32 values a `Quantized` stands for: `[*lead, *shape]`, lead the batch axes of a
    stacked `Quantized` (as `from_bytes` of a `[*lead, nbytes]` buffer gives)."""
    values = _apply_scale(decode_elements(q.payload, q.fmt), q.scales, q.fmt)
    lead = values.shape[:-2]
    n = math.prod(q.shape)
    return values.reshape(*lead, -1)[..., :n].reshape(*lead, *q.shape)


def _scale_to_bytes(stored: jax.Array, fmt: Format) -> jax.Array:
    if fmt.scale_dtype == "e8m0":
        return stored[..., None]
    return lax.bitcast_convert_type(stored, jnp.uint8)  # [..., scale_bytes]


def _scale_from_bytes(raw: jax.Array, fmt: Format) -> jax.Array:
    if fmt.scale_dtype == "e8m0":
        return raw[..., 0]
    return lax.bitcast_convert_type(raw, jnp.dtype(fmt.scale_dtype))


def to_bytes(q: Quantized) -> jax.Array:
    """One uint8 buffer, block after block: its payload bytes, then its scale bytes (leading
    batch axes kept)."""
    lead = q.payload.shape[:-2]
    rows = jnp.concatenate([q.payload, _scale_to_bytes(q.scales, q.fmt)], axis=-1)
    return rows.reshape(*lead, -1)  # [..., blocks, bytes_per_block] -> [..., nbytes]


def from_bytes(buf: jax.Array, fmt: Format, shape: tuple[int, ...], dtype="float32") -> Quantized:
    """Inverse of `to_bytes` for a buffer holding an array of `shape` quantized with `fmt`."""
    blocks = -(-math.prod(shape) // fmt.block_size)
    if buf.dtype != jnp.uint8 or buf.shape[-1] != blocks * fmt.bytes_per_block:
        raise ValueError(f"buffer {buf.dtype}{list(buf.shape)} does not hold {blocks} blocks of "
                         f"{fmt} ({blocks * fmt.bytes_per_block} bytes)")
    rows = buf.reshape(*buf.shape[:-1], blocks, fmt.bytes_per_block)
    split = fmt.payload_bytes_per_block
    payload, scales = rows[..., :split], _scale_from_bytes(rows[..., split:], fmt)
    return Quantized(payload, scales, tuple(shape), jnp.dtype(dtype).name, fmt)


def encode(x: jax.Array, fmt: Format, *, key: jax.Array | None = None) -> jax.Array:
    """Quantize rows `[..., n]` (n a multiple of the block) straight to wire bytes `[..., nbytes]`.

    The collectives' hot path: same numerics as `quantize` (`key`: stochastic rounding),
    keeping leading axes.
    """
    *lead, n = x.shape
    if n % fmt.block_size:
        raise ValueError(f"encode takes rows of whole blocks: {n} values is not a multiple of "
                         f"block_size {fmt.block_size} (quantize pads; encode does not)")
    xb = x.astype(jnp.float32).reshape(*lead, n // fmt.block_size, fmt.block_size)
    payload, stored = _quantize_blocks(xb, fmt, key)
    return to_bytes(Quantized(payload, stored, (n,), "float32", fmt))


def decode(buf: jax.Array, fmt: Format, n: int) -> jax.Array:
    """Wire bytes `[..., nbytes]` -> f32 `[..., n]` (inverse of `encode`)."""
    if n % fmt.block_size:
        raise ValueError(f"decode takes rows of whole blocks: {n} values is not a multiple of "
                         f"block_size {fmt.block_size} (use from_bytes and dequantize)")
    q = from_bytes(buf, fmt, (n,))
    values = _apply_scale(decode_elements(q.payload, fmt), q.scales, fmt)
    return values.reshape(*buf.shape[:-1], n)


def encoded_bytes(m: int, fmt: Format | None, dtype) -> int:
    """Bytes `m` values travel as: blocks of `fmt`, or raw `dtype` when fmt is None."""
    return m * jnp.dtype(dtype).itemsize if fmt is None else fmt.nbytes(m)


class Codec:
    """Values <-> wire bytes: block-quantized with `fmt`, or raw bits of `dtype` if fmt is None."""

    def __init__(self, fmt: Format | None, dtype):
        self.fmt = fmt
        self.dtype = jnp.dtype(dtype)
        self.acc = jnp.promote_types(self.dtype, jnp.float32)  # accumulate in f32 (or f64)
        self.align = fmt.block_size if fmt is not None else 1

    def encode(self, v: jax.Array, key=None) -> jax.Array:  # [..., m] -> uint8 [..., bytes]
        if self.fmt is not None:
            return encode(v, self.fmt, key=key)
        raw = lax.bitcast_convert_type(v.astype(self.dtype), jnp.uint8)
        return raw.reshape(*v.shape[:-1], -1)

    def decode(self, buf: jax.Array, m: int) -> jax.Array:  # uint8 [..., bytes] -> acc [..., m]
        if self.fmt is not None:
            return decode(buf, self.fmt, m).astype(self.acc)
        if self.dtype.itemsize > 1:
            buf = buf.reshape(*buf.shape[:-1], m, self.dtype.itemsize)
        return lax.bitcast_convert_type(buf, self.dtype).astype(self.acc)

    def nbytes(self, m: int) -> int:
        return encoded_bytes(m, self.fmt, self.dtype)
