"""Element codes and packing: grid values to the bits that travel, and back.

A quantized block is its scale (scales.py) and its elements, each a value on the format's grid
(formats.py). Each element travels as a code of `elem_bits` bits: two's complement for integer
grids; sign | exponent | mantissa for float grids (fp8, fp4, bias 1 - emin), the same code XLA's
f32 -> fp8 cast gives for a value on the grid, read off the f32 bits in a few integer
operations (XLA:CPU converts fp8 slowly, and fp4 has no XLA type at all).

Codes are packed into a block's payload: 4-bit elements two per byte, element i of a block in
the low nibble of byte i and element i + B/2 in its high nibble; 8-bit ones a byte each; other
widths one little-endian bit stream per block, element i in bits [i N, (i + 1) N). How a
block's payload and scale travel, as a message of two lane-dense operands, is in wire.py.

The code is written for Mosaic too, which compiles it inside the Pallas TPU kernels (through
kernels/tiles.py): 32-bit shifts, no 8-bit ones; iotas rather than captured array constants;
reshapes that keep the block axis. One packing path serves every width (`pack_codes`).
The two ways to unpack nibbles, and why `dequantize` and `decode` each take their own, are
XLA:CPU speed (`decode_elements`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .formats import Format


def float_codes(q: jax.Array, fmt: Format) -> jax.Array:
    """Grid values of a float element (sign | exponent | mantissa, bias 1 - emin) -> int32 codes.

    Read off q's f32 bits: the same code XLA's f32 -> fp8 cast gives for a value on the grid,
    in a few integer operations (XLA:CPU converts fp8 slowly), and the only route for fp4.
    """
    m, emin = fmt.mant_bits, fmt.min_exponent
    bits = lax.bitcast_convert_type(jnp.abs(q), jnp.int32)
    e = (bits >> 23 & 0xFF) - 127
    normal = e >= emin
    mant = jnp.where(normal, bits >> (23 - m) & ((1 << m) - 1),
                     (jnp.abs(q) * 2.0 ** (m - emin)).astype(jnp.int32))
    sign = jnp.signbit(q).astype(jnp.int32) << (fmt.elem_bits - 1)
    return sign | jnp.where(normal, e - emin + 1, 0) << m | mant


def float_values(c: jax.Array, fmt: Format) -> jax.Array:
    """Inverse of `float_codes`: int32 codes -> f32 grid values. A normal code's bits, moved
    to f32's exponent and mantissa fields and rebiased, are the value; a subnormal code's
    mantissa counts steps of 2^(emin - m)."""
    m, emin = fmt.mant_bits, fmt.min_exponent
    mag = c & ((1 << (fmt.elem_bits - 1)) - 1)
    normal = lax.bitcast_convert_type((mag << (23 - m)) + ((126 + emin) << 23), jnp.float32)
    mag = jnp.where(mag >= 1 << m, normal, mag.astype(jnp.float32) * 2.0 ** (emin - m))
    # the sign by a product with -1, which keeps -0 (Triton negates as 0 - x, which gives +0:
    # kernels/gpu.py); XLA:TPU counts the same bytes or fewer for it (data/tpu-bytes.json)
    return mag * jnp.where(c >> (fmt.elem_bits - 1) & 1 == 1, -1.0, 1.0)


def _group(bits: int) -> tuple[int, int]:
    """(elements, bytes) of the smallest whole-byte group of `bits`-bit codes: 4 codes of 6
    bits fill 3 bytes."""
    g = 8 // math.gcd(bits, 8)
    return g, g * bits // 8


def _pack_groups(groups: jax.Array, bits: int, axis: int) -> jax.Array:
    """Codes grouped along `axis` (g of them, `_group`) -> their nb bytes, stacked last.

    The one packing path of every width: code i of a group holds bits [i bits, (i + 1) bits)
    of the group's little-endian stream, so byte r takes code i shifted by lo = i bits - 8 r
    (left if positive, right if not) and masked to 8 bits; the codes' bits never overlap, so
    the sum over the group is their OR. A reduction with iota shifts (32-bit, no captured
    constants: Mosaic compiles it; XLA:CPU does not fuse the quantizer into strided slices,
    module essay of quantize.py)."""
    g, nb = _group(bits)
    assert axis in (-1, -2)
    i = lax.broadcasted_iota(jnp.int32, (g, 1) if axis == -2 else (1, g), 2 + axis)
    out = []
    for r in range(nb):
        lo = bits * i - 8 * r
        left, right = jnp.clip(lo, 0, 8), jnp.clip(-lo, 0, 31)
        out.append(jnp.sum(((groups << left) >> right) & 0xFF, axis=axis))
    return jnp.stack(out, axis=-1).astype(jnp.uint8)


def _unpack_bits(payload: jax.Array, bits: int) -> jax.Array:
    """Inverse of `_pack_groups` for widths other than 4 and 8: uint8 [..., PB] -> int32
    codes [..., PB * 8 / bits]."""
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
    return pack_codes(q.astype(jnp.int32) if fmt.is_int else float_codes(q, fmt), fmt)


def pack_codes(codes: jax.Array, fmt: Format) -> jax.Array:
    """int32 codes [..., B] (two's complement for integers) -> packed uint8 [..., PB].

    One path for every width (`_pack_groups`), so `encode` and `to_bytes(quantize(x))` cannot
    differ; only which codes share a group is the layout's: 4-bit elements i and i + B/2 (the
    two halves of the block), any other width g consecutive codes."""
    codes = (codes & ((1 << fmt.elem_bits) - 1)).astype(jnp.int32)
    lead = codes.shape[:-1]
    if fmt.elem_bits == 4:  # [..., 2, B/2]: the halves' reduction (quantize.py, "Speed")
        return _pack_groups(codes.reshape(*lead, 2, -1), 4, axis=-2).reshape(*lead, -1)
    g, _ = _group(fmt.elem_bits)
    groups = codes.reshape(*lead, -1, g)  # [..., B / g, g]
    return _pack_groups(groups, fmt.elem_bits, axis=-1).reshape(*lead, -1)


def decode_elements(payload: jax.Array, fmt: Format, *, from_wire: bool = True,
                    mosaic: bool = False) -> jax.Array:
    """Packed uint8 [..., PB] -> grid values f32 [..., B].

    4-bit elements: byte i holds elements i (low nibble) and i + B/2 (high nibble). Two ways to
    unpack them, for XLA:CPU's sake (quantize.py's essay, "Speed"): `from_wire` bytes (decode:
    they arrive from a collective) as a concatenation of the two nibble halves, which XLA
    materialises once so that every consumer reads plain bytes: one byte per element (an int32
    one would double a ring hop's decode + add + encode; `mosaic=True`, inside a TPU kernel,
    widens first: Mosaic refuses shifts of 8-bit vectors, "failed to legalize arith.shrui");
    bytes fresh from `quantize` in the same jit (dequantize) through a broadcast, which keeps
    XLA from fusing the nibble-packing reduction, and with it the whole quantizer, into the
    unpacking, a loop XLA:CPU runs many times slower.
    """
    if fmt.elem_bits == 4 and from_wire:
        wide = payload.astype(jnp.int32) if mosaic else payload
        c = jnp.concatenate([wide & 0xF, wide >> 4], axis=-1).astype(jnp.int32)
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
    return float_values(c, fmt)
