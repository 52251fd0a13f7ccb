"""The wire: a quantized array as the one uint8 buffer a collective sends, and back.

Wire layout. `to_bytes` lays out one uint8 buffer, block after block: each block's payload
(its elements packed as quantize.py describes: 4-bit ones two per byte, element i of a block in
the low nibble of byte i, element i + B/2 in its high nibble) followed by that block's scale
bytes (the bf16/f32 bit pattern, little-endian, or the E8M0 byte). A collective sends exactly
that buffer, so the bytes counted are the bytes sent. Block-major keeps every block's bytes
contiguous, so encoding is one pass that writes rows: putting all payloads first and all scales
after made XLA:CPU fuse the quantizer into a flat, strided write, 15x slower for int4
(measured: 159 ms against 11 ms for 4M values, one core).

The wire codec. `Codec(fmt, dtype)` is what a collective sends per message: `encode`d blocks of
`fmt`, or with `fmt=None` the raw bits of `dtype` (a bf16 ring really sends 2 bytes per value),
and the accumulation dtype the receiver adds in (f32, or f64 for f64 inputs). The executor in
collectives.py and the Pallas kernels use this one codec, so both send the same bytes.

`encode` and `decode` are the collectives' hot path: `quantize` straight to wire bytes and
back, for rows of whole blocks, with the same numerics (`decode` reads the scales as f32 straight
from their bytes). `encode_raw` and `decode_raw` do the same for an unquantized message: the raw
little-endian bits of its dtype, a bitcast (inside a TPU kernel the same bytes through 32-bit
integer shifts, which Mosaic compiles).

A bf16 or f32 scale becomes its bytes the same way: a bitcast on the XLA route, the 32-bit
shifts only in the Mosaic form (`mosaic=True`), which refuses bitcasts between widths. The
shifts are exact everywhere, but XLA:GPU miscompiled them once fused into the rows of a
format whose block is an odd number of bytes with a two-byte scale (int7/b8: 7 + 2, int3/b8:
3 + 2): a scale's low byte came out wrong under `jit` (jax 0.11.2 on an H100, 54 of 621
bytes; `equarx-ref check` showed it), where the bitcast gives the spec's bytes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from .elements import decode_elements
from .formats import Format
from .quantize import Quantized, quantize_blocks
from .scales import apply_scale

__all__ = ["decode", "decode_raw", "encode", "encode_raw", "from_bytes", "to_bytes"]


def _bits32(v: jax.Array) -> jax.Array:
    """The bit pattern of bf16 or f32 values as int32 (bf16: in the low 16 bits).

    Same-width bitcasts and a widening integer conversion only: Mosaic (the TPU kernel
    compiler) refuses `bitcast_convert_type` between types of different widths."""
    if v.dtype == jnp.float32:
        return lax.bitcast_convert_type(v, jnp.int32)
    if v.dtype == jnp.bfloat16:
        return lax.bitcast_convert_type(v, jnp.uint16).astype(jnp.int32)
    raise TypeError(f"no 32-bit packing for {v.dtype}")


def _int32_to_bytes(bits: jax.Array, width: int) -> jax.Array:
    """int32 [...] -> uint8 [..., width]: the low `width` bytes, little-endian (32-bit ops)."""
    parts = [(bits >> (8 * i)) & 0xFF for i in range(width)]
    return jnp.stack(parts, axis=-1).astype(jnp.uint8)  # interleaved as int32, then narrowed


def _bytes_to_int32(raw: jax.Array) -> jax.Array:
    """uint8 [..., width] (little-endian, width <= 4) -> int32 [...] (32-bit ops)."""
    out = raw[..., 0].astype(jnp.int32)
    for i in range(1, raw.shape[-1]):
        out = out | raw[..., i].astype(jnp.int32) << (8 * i)
    return out


def _scale_to_bytes(stored: jax.Array, fmt: Format, mosaic: bool = False) -> jax.Array:
    """Stored scales -> uint8 `[..., scale_bytes]`, little-endian (module essay: a bitcast,
    32-bit shifts in the Mosaic form)."""
    if fmt.scale_dtype == "e8m0":
        return stored[..., None]
    if not mosaic:
        return lax.bitcast_convert_type(stored, jnp.uint8)  # [..., scale_bytes]
    return _int32_to_bytes(_bits32(stored), fmt.scale_bytes)  # [..., scale_bytes]


def _scale_from_bytes(raw: jax.Array, fmt: Format) -> jax.Array:
    """The stored scales (bf16/f32 values, or E8M0 bytes) from their wire bytes."""
    if fmt.scale_dtype == "e8m0":
        return raw[..., 0]
    bits = _bytes_to_int32(raw)
    if fmt.scale_dtype == "float32":
        return lax.bitcast_convert_type(bits, jnp.float32)
    return lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.bfloat16)


def _scale_f32_from_bytes(raw: jax.Array, fmt: Format) -> jax.Array:
    """The scales as f32 (E8M0: their bytes), straight from the wire: a bf16 pattern shifted
    into the top half of an f32 is the same value, with no bf16 arithmetic on the way (what
    `decode` uses; v5e has no bf16 vector unit)."""
    if fmt.scale_dtype == "e8m0":
        return raw[..., 0]
    bits = _bytes_to_int32(raw)
    if fmt.scale_dtype == "bfloat16":
        bits = bits << 16
    return lax.bitcast_convert_type(bits, jnp.float32)


def to_bytes(q: Quantized, *, mosaic: bool = False) -> jax.Array:
    """One uint8 buffer, block after block: its payload bytes, then its scale bytes (leading
    batch axes kept; `mosaic=True` inside a TPU kernel: 32-bit integer operations only)."""
    lead = q.payload.shape[:-2]
    rows = jnp.concatenate([q.payload, _scale_to_bytes(q.scales, q.fmt, mosaic)], axis=-1)
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


def encode(x: jax.Array, fmt: Format, *, key: jax.Array | None = None,
           mosaic: bool = False) -> jax.Array:
    """Quantize rows `[..., n]` (n a multiple of the block) straight to wire bytes `[..., nbytes]`.

    The collectives' hot path: same numerics as `quantize` (`key`: stochastic rounding),
    keeping leading axes (`mosaic=True` inside a TPU kernel: 32-bit integer operations only).
    """
    *lead, n = x.shape
    if n % fmt.block_size:
        raise ValueError(f"encode takes rows of whole blocks: {n} values is not a multiple of "
                         f"block_size {fmt.block_size} (quantize pads; encode does not)")
    xb = x.astype(jnp.float32).reshape(*lead, n // fmt.block_size, fmt.block_size)
    payload, stored = quantize_blocks(xb, fmt, key)
    return to_bytes(Quantized(payload, stored, (n,), "float32", fmt), mosaic=mosaic)


def decode(buf: jax.Array, fmt: Format, n: int, *, mosaic: bool = False) -> jax.Array:
    """Wire bytes `[..., nbytes]` -> f32 `[..., n]` (inverse of `encode`; `mosaic=True` inside
    a TPU kernel: 32-bit shifts only)."""
    if n % fmt.block_size:
        raise ValueError(f"decode takes rows of whole blocks: {n} values is not a multiple of "
                         f"block_size {fmt.block_size} (use from_bytes and dequantize)")
    if buf.dtype != jnp.uint8 or buf.shape[-1] != fmt.nbytes(n):
        raise ValueError(f"buffer {buf.dtype}{list(buf.shape)} does not hold {n} values of "
                         f"{fmt} ({fmt.nbytes(n)} bytes)")
    rows = buf.reshape(*buf.shape[:-1], n // fmt.block_size, fmt.bytes_per_block)
    split = fmt.payload_bytes_per_block
    scales = _scale_f32_from_bytes(rows[..., split:], fmt)
    values = apply_scale(decode_elements(rows[..., :split], fmt, mosaic=mosaic), scales, fmt)
    return values.reshape(*buf.shape[:-1], n)


def encode_raw(v: jax.Array, dtype, *, mosaic: bool = False) -> jax.Array:
    """Values `[..., m]` as the raw bits of `dtype`, little-endian: uint8 `[..., m * itemsize]`.

    What an unquantized message (fmt=None) sends: a bitcast, no arithmetic (the bytes in
    memory order, little-endian on the CPUs and TPUs jax ships for; a test holds it).
    `mosaic=True`, inside a TPU kernel, builds the same bytes for bf16 and f32 with 32-bit
    integer shifts, which Mosaic compiles (it refuses bitcasts between widths); on XLA:CPU
    the bf16 ring took 4.2x a plain add with them and 1.6x with the bitcast."""
    dtype = jnp.dtype(dtype)
    v = v.astype(dtype)
    if mosaic and dtype in (jnp.float32, jnp.bfloat16):
        raw = _int32_to_bytes(_bits32(v), dtype.itemsize)
    else:
        raw = lax.bitcast_convert_type(v, jnp.uint8)
    return raw.reshape(*v.shape[:-1], -1)


def decode_raw(buf: jax.Array, dtype, m: int, *, mosaic: bool = False) -> jax.Array:
    """Inverse of `encode_raw`: uint8 `[..., m * itemsize]` -> `dtype` `[..., m]`."""
    dtype = jnp.dtype(dtype)
    if buf.dtype != jnp.uint8 or buf.shape[-1] != m * dtype.itemsize:
        raise ValueError(f"buffer {buf.dtype}{list(buf.shape)} does not hold {m} values of "
                         f"{dtype.name} ({m * dtype.itemsize} bytes)")
    if dtype.itemsize == 1:
        return lax.bitcast_convert_type(buf, dtype)
    raw = buf.reshape(*buf.shape[:-1], m, dtype.itemsize)
    if not mosaic:
        return lax.bitcast_convert_type(raw, dtype)
    if dtype == jnp.float32:
        return lax.bitcast_convert_type(_bytes_to_int32(raw), jnp.float32)
    if dtype == jnp.bfloat16:
        return lax.bitcast_convert_type(_bytes_to_int32(raw).astype(jnp.uint16), jnp.bfloat16)
    return lax.bitcast_convert_type(raw, dtype)


def encoded_bytes(m: int, fmt: Format | None, dtype) -> int:
    """Bytes `m` values travel as: blocks of `fmt`, or raw `dtype` when fmt is None."""
    return m * jnp.dtype(dtype).itemsize if fmt is None else fmt.nbytes(m)


class Codec:
    """Values <-> wire bytes: block-quantized with `fmt`, or raw bits of `dtype` if fmt is None
    (`mosaic=True` inside a TPU kernel: 32-bit integer operations only)."""

    def __init__(self, fmt: Format | None, dtype, *, mosaic: bool = False):
        self.fmt, self.mosaic = fmt, mosaic
        self.dtype = jnp.dtype(dtype)
        # accumulate in f32 (f64 for f64): fp8 does not promote implicitly, so no promote_types
        self.acc = jnp.dtype(jnp.float64 if self.dtype.itemsize > 4 else jnp.float32)
        self.align = fmt.block_size if fmt is not None else 1

    def encode(self, v: jax.Array, key=None) -> jax.Array:  # [..., m] -> uint8 [..., bytes]
        if self.fmt is not None:
            return encode(v, self.fmt, key=key, mosaic=self.mosaic)
        return encode_raw(v, self.dtype, mosaic=self.mosaic)

    def decode(self, buf: jax.Array, m: int, dtype=None) -> jax.Array:
        """uint8 [..., bytes] -> values [..., m] in `dtype` (default: the accumulation dtype)."""
        values = decode(buf, self.fmt, m, mosaic=self.mosaic) if self.fmt is not None else \
            decode_raw(buf, self.dtype, m, mosaic=self.mosaic)
        return values.astype(dtype or self.acc)

    def decode_in_order(self, buf: jax.Array, m: int, dtype, order) -> jax.Array:
        """Messages `buf` `[count, bytes]` of `m` values each, decoded in `order` (a static
        permutation of their indices): `decode(buf[order])`. The bytes are put in order
        before decoding, by a transpose where `order` reads a `[a, count / a]` grid by
        columns: decoding int4 into a transposed order took 1.8x as long as into rows in place
        (16M values, XLA:CPU)."""
        count, order = len(order), list(order)
        for a in range(2, count):
            if count % a == 0 and order == [(c % a) * (count // a) + c // a
                                            for c in range(count)]:
                grid = buf.reshape(a, count // a, *buf.shape[1:]).swapaxes(0, 1)
                return self.decode(grid.reshape(buf.shape), m, dtype)
        return self.decode(jnp.take(buf, jnp.asarray(order, jnp.int32), axis=0), m, dtype)

    def nbytes(self, m: int) -> int:
        return encoded_bytes(m, self.fmt, self.dtype)

    #: `encode` takes a message in the accumulation dtype (`execute.py` hands it f32 rows);
    #: the Mosaic codec (`kernels.row_codec.RowCodec`) takes the input's own dtype instead.
    reads_raw = False
    #: Whether the executor holds the input as rows of 128 values (`execute.run_schedule`):
    #: the Mosaic codec's kernels read that view; this codec takes any.
    dense = False

    def fuses(self, m: int) -> bool:
        """Whether this codec has a one-pass hop for messages of `m` values: never (the
        executor decodes and adds; `kernels.row_codec.RowCodec.hop` is one)."""
        return False

    def places(self, shape, window, count: int = 1) -> bool:
        """Whether this codec reads a message's chunks, or decodes a pipeline's piece, where
        they lie in the array that holds them: never (the executor cuts them out and joins the
        pieces; `kernels.row_codec.RowCodec.places` does both)."""
        return False
