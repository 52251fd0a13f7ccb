"""The wire: what a collective sends for a message of values, and back.

A message is two lane-dense arrays, the spec's wire contract (spec/wire.py):

    payload   uint8 [G PB, R]   payload[j PB + i, r] = byte i of block r G + j
    scales    [G, R]            scales[j, r] = the bits of block r G + j's scale
                                (uint16 for bf16, uint32 for f32, uint8 for E8M0)

for a message of R rows of G blocks (G = 128 / B when the block size B divides 128, so a row
is 128 values; else 1). Each block owns one lane: its payload bytes run down it, its scale
sits in the same lane of the scales. A collective sends both arrays as they are, so the bytes
counted are the bytes sent, and the scales travel as unsigned integers, which no backend
widens (XLA:CPU sends a bf16 array as f32). A message is always whole rows: the schedules cut
chunks in rows (`Format.row`), so the layout never has a ragged end.

Why two arrays and not one buffer. One `u8[blocks, PB + scale bytes]` buffer, block after
block, is the canonical serialization (`to_bytes`, the spec's golden bytes), but rows of 34
bytes do not line up with anything a chip computes on: a TPU kernel spends hundreds of times its
HBM time laying codes and scale bytes into them (REFERENCES.md, "The TPU's own schedule"), and GPUs
write them byte by byte. Laid out block-per-lane, the message is the values' rows transposed:
a TPU kernel transposes each 128 x 128 tile of values once, finds a block's maximum in
registers and writes whole vector registers of codes (kernels/codec.py). The XLA codec here
is the readable one: it quantizes the blocks (`quantize_blocks`) and transposes the result.

`Codec(fmt, dtype)` is what the collectives send per message: `encode`d blocks of `fmt`, or
with `fmt=None` the raw bits of `dtype` (a bf16 ring really sends 2 bytes per value, as
uint16: a bitcast XLA:CPU cannot widen), and the accumulation dtype the receiver adds in (f32,
or f64 for f64 inputs). The executor (execute.py) and the kernels' codec
(`kernels.mosaic_codec.MosaicCodec`) speak its language, so every backend sends the same messages.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from .elements import decode_elements
from .formats import Format
from .quantize import Quantized, quantize_blocks
from .scales import apply_scale

__all__ = ["Codec", "Message", "decode", "decode_raw", "encode", "encode_raw", "from_bytes",
           "message_shapes", "to_bytes"]

_SCALE_BITS = {"bfloat16": jnp.uint16, "float32": jnp.uint32, "e8m0": jnp.uint8}
_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


class Message(NamedTuple):
    """One message, as a collective sends it (a pytree: `jax.tree.map` moves both arrays).

    Attributes:
        payload: uint8 `[..., G PB, R]`, or for an unquantized message the values' raw bits
            `[..., m]` (an unsigned integer of their width).
        scales: `[..., G, R]` scale bits (uint16 / uint32 / uint8), or None unquantized.
    """

    payload: jax.Array
    scales: jax.Array | None = None


def message_shapes(m: int, fmt: Format) -> tuple[tuple[int, int], tuple[int, int]]:
    """The (payload, scales) shapes of a message of `m` values of `fmt` (whole rows)."""
    if m % fmt.row:
        raise ValueError(f"a message of {fmt} is whole rows of {fmt.row} values: "
                         f"{m} values is not")
    g, rows = fmt.blocks_per_row, m // fmt.row
    return (g * fmt.payload_bytes_per_block, rows), (g, rows)


def _scale_bits(stored: jax.Array, fmt: Format) -> jax.Array:
    """Stored scales (bf16 / f32 values, E8M0 bytes) as the unsigned integers that travel."""
    if fmt.scale_dtype == "e8m0":
        return stored
    return lax.bitcast_convert_type(stored, _SCALE_BITS[fmt.scale_dtype])


def _stored_scales(bits: jax.Array, fmt: Format) -> jax.Array:
    """Inverse of `_scale_bits`."""
    if fmt.scale_dtype == "e8m0":
        return bits
    return lax.bitcast_convert_type(bits, jnp.dtype(fmt.scale_dtype))


def encode(x: jax.Array, fmt: Format, *, key: jax.Array | None = None) -> Message:
    """Quantize rows `[..., m]` (m whole rows of `fmt`) straight to their message.

    Same numerics as `quantize` (`key`: stochastic rounding), leading axes kept."""
    *lead, m = x.shape
    (pb_rows, rows), _ = message_shapes(m, fmt)
    g, pb = fmt.blocks_per_row, fmt.payload_bytes_per_block
    xb = x.astype(jnp.float32).reshape(*lead, m // fmt.block_size, fmt.block_size)
    payload, stored = quantize_blocks(xb, fmt, key)  # [..., blocks, PB], [..., blocks]
    payload = jnp.swapaxes(payload.reshape(*lead, rows, g, pb), -3, -1)  # [..., PB, G, R]
    payload = jnp.swapaxes(payload, -3, -2).reshape(*lead, pb_rows, rows)  # [..., G PB, R]
    scales = jnp.swapaxes(_scale_bits(stored, fmt).reshape(*lead, rows, g), -1, -2)
    return Message(payload, scales)


def decode(message: Message, fmt: Format, m: int) -> jax.Array:
    """A message of `m` values (`[..., G PB, R]`, `[..., G, R]`) -> f32 `[..., m]`."""
    (pb_rows, rows), (g, _) = message_shapes(m, fmt)
    payload, scales = message
    lead = payload.shape[:-2]
    if payload.dtype != jnp.uint8 or payload.shape[-2:] != (pb_rows, rows) or \
            scales is None or scales.shape != (*lead, g, rows) or \
            scales.dtype != _SCALE_BITS[fmt.scale_dtype]:
        got = (f"{payload.dtype}{list(payload.shape)} and " + ("no scales" if scales is None
               else f"{scales.dtype}{list(scales.shape)}"))
        raise ValueError(f"a message of {m} values of {fmt} is uint8 [..., {pb_rows}, {rows}] "
                         f"and {jnp.dtype(_SCALE_BITS[fmt.scale_dtype]).name}[..., {g}, "
                         f"{rows}]; got {got}")
    pb = fmt.payload_bytes_per_block
    blocks = jnp.swapaxes(payload.reshape(*lead, g, pb, rows), -3, -2)  # [..., PB, G, R]
    blocks = jnp.swapaxes(blocks, -3, -1).reshape(*lead, rows * g, pb)  # [..., blocks, PB]
    stored = _stored_scales(jnp.swapaxes(scales, -1, -2).reshape(*lead, rows * g), fmt)
    values = apply_scale(decode_elements(blocks, fmt), stored, fmt)
    return values.reshape(*lead, m)


def encode_raw(v: jax.Array, dtype) -> Message:
    """Values `[..., m]` as the raw bits of `dtype`, an unsigned integer of its width: what an
    unquantized message (fmt=None) sends, a bitcast, no arithmetic."""
    dtype = jnp.dtype(dtype)
    return Message(lax.bitcast_convert_type(v.astype(dtype), _UINT[dtype.itemsize]))


def decode_raw(message: Message, dtype, m: int) -> jax.Array:
    """Inverse of `encode_raw`: `[..., m]` bits -> `dtype` `[..., m]`."""
    dtype, payload = jnp.dtype(dtype), message.payload
    if payload.dtype != _UINT[dtype.itemsize] or payload.shape[-1] != m:
        raise ValueError(f"an unquantized message of {m} values of {dtype.name} is "
                         f"{jnp.dtype(_UINT[dtype.itemsize]).name}[..., {m}], got "
                         f"{payload.dtype}{list(payload.shape)}")
    return lax.bitcast_convert_type(payload, dtype)


def encoded_bytes(m: int, fmt: Format | None, dtype) -> int:
    """Bytes `m` values travel as: blocks of `fmt`, or raw `dtype` when fmt is None."""
    return m * jnp.dtype(dtype).itemsize if fmt is None else fmt.nbytes(m)


# ---- the canonical single buffer ------------------------------------------------------------


def _int32_to_bytes(bits: jax.Array, width: int) -> jax.Array:
    """int32 [...] -> uint8 [..., width]: the low `width` bytes, little-endian."""
    parts = [(bits >> (8 * i)) & 0xFF for i in range(width)]
    return jnp.stack(parts, axis=-1).astype(jnp.uint8)


def _bytes_to_int32(raw: jax.Array) -> jax.Array:
    """uint8 [..., width] (little-endian, width <= 4) -> int32 [...]."""
    out = raw[..., 0].astype(jnp.int32)
    for i in range(1, raw.shape[-1]):
        out = out | raw[..., i].astype(jnp.int32) << (8 * i)
    return out


def to_bytes(q: Quantized) -> jax.Array:
    """The canonical single buffer (spec/wire.py), block after block: each block's payload
    bytes, then its scale bytes, little-endian (leading batch axes kept)."""
    lead = q.payload.shape[:-2]
    if q.fmt.scale_dtype == "e8m0":
        scale = q.scales[..., None]
    else:
        scale = lax.bitcast_convert_type(q.scales, jnp.uint8)  # [..., blocks, scale bytes]
    rows = jnp.concatenate([q.payload, scale], axis=-1)
    return rows.reshape(*lead, -1)  # [..., blocks, bytes_per_block] -> [..., nbytes]


def from_bytes(buf: jax.Array, fmt: Format, shape: tuple[int, ...], dtype="float32") -> Quantized:
    """Inverse of `to_bytes` for a buffer holding an array of `shape` quantized with `fmt`."""
    blocks = -(-math.prod(shape) // fmt.block_size)
    if buf.dtype != jnp.uint8 or buf.shape[-1] != blocks * fmt.bytes_per_block:
        raise ValueError(f"buffer {buf.dtype}{list(buf.shape)} does not hold {blocks} blocks of "
                         f"{fmt} ({blocks * fmt.bytes_per_block} bytes)")
    rows = buf.reshape(*buf.shape[:-1], blocks, fmt.bytes_per_block)
    split = fmt.payload_bytes_per_block
    raw = rows[..., split:]
    if fmt.scale_dtype == "e8m0":
        scales = raw[..., 0]
    else:
        bits = _bytes_to_int32(raw)
        scales = lax.bitcast_convert_type(bits, jnp.float32) if fmt.scale_dtype == "float32" \
            else lax.bitcast_convert_type(bits.astype(jnp.uint16), jnp.bfloat16)
    return Quantized(rows[..., :split], scales, tuple(shape), jnp.dtype(dtype).name, fmt)


# ---- the collectives' codec ------------------------------------------------------------------


def _stack(messages, axis: int = 0) -> Message:
    """Messages joined along `axis` of each array (a leading axis of chunks, or, for the
    last axis, rows: the message of the values laid end to end)."""
    return jax.tree.map(lambda *a: jnp.concatenate(a, axis=axis), *messages)


class Codec:
    """Values <-> messages: block-quantized with `fmt`, or the raw bits of `dtype` if fmt is
    None. The executor's codec protocol (execute.py); `kernels.mosaic_codec.MosaicCodec` has the
    same interface on the TPU kernels."""

    def __init__(self, fmt: Format | None, dtype):
        self.fmt = fmt
        self.dtype = jnp.dtype(dtype)
        # accumulate in f32 (f64 for f64): fp8 does not promote implicitly, so no promote_types
        self.acc = jnp.dtype(jnp.float64 if self.dtype.itemsize > 4 else jnp.float32)
        #: values a chunk is cut in multiples of: whole message rows
        self.align = fmt.row if fmt is not None else 1

    def encode(self, v: jax.Array, key=None) -> Message:  # [..., m] -> Message [..., *]
        if self.fmt is not None:
            return encode(v, self.fmt, key=key)
        return encode_raw(v, self.dtype)

    def decode(self, message: Message, m: int, dtype=None) -> jax.Array:
        """A message `[..., *]` -> values `[..., m]` in `dtype` (default: the accumulation
        dtype)."""
        values = decode(message, self.fmt, m) if self.fmt is not None else \
            decode_raw(message, self.dtype, m)
        return values.astype(dtype or self.acc)

    def join(self, messages) -> Message:
        """Messages of consecutive runs of values as the one message of all of them."""
        return _stack(messages, axis=-1)

    def flatten(self, message: Message) -> Message:
        """Messages `[count, *]` of consecutive runs of values as the one message of all."""
        return jax.tree.map(lambda a: jnp.moveaxis(a, 0, -2).reshape(
            *a.shape[1:-1], a.shape[0] * a.shape[-1]), message)

    def decode_in_order(self, message: Message, m: int, dtype, order) -> jax.Array:
        """Messages `[count, *]` of `m` values each, decoded in `order` (a static permutation
        of their indices): `decode(message[order])`. The messages are put in order before
        decoding, by a transpose where `order` reads a `[a, count / a]` grid by columns."""
        count, order = len(order), list(order)
        for a in range(2, count):
            if count % a == 0 and order == [(c % a) * (count // a) + c // a
                                            for c in range(count)]:
                grid = jax.tree.map(lambda x, a=a: jnp.swapaxes(
                    x.reshape(a, count // a, *x.shape[1:]), 0, 1).reshape(x.shape), message)
                return self.decode(grid, m, dtype)
        index = jnp.asarray(order, jnp.int32)
        return self.decode(jax.tree.map(lambda x: jnp.take(x, index, axis=0), message), m,
                           dtype)

    @staticmethod
    def supports(fmt) -> bool:
        """Whether this codec codes `fmt`: any Format (a backend's codec may code fewer, and
        `rules.py` refuses the others before it runs)."""
        return isinstance(fmt, Format)

    #: `encode` takes a message in the accumulation dtype (`execute.py` hands it f32 rows);
    #: the Mosaic codec (`kernels.mosaic_codec.MosaicCodec`) takes the input's own dtype instead.
    reads_raw = False
    #: Whether the executor holds the input as rows of 128 values (`execute.run_schedule`):
    #: the Mosaic codec's kernels read that view; this codec takes any.
    dense = False

    def fuses(self, m: int) -> bool:
        """Whether this codec has a one-pass hop for messages of `m` values: never (the
        executor decodes and adds; `kernels.mosaic_codec.MosaicCodec.hop` is one)."""
        return False

    def places(self, shape, window, count: int = 1) -> bool:
        """Whether this codec reads a message's chunks, or decodes a pipeline's piece, where
        they lie in the array that holds them: never (the executor cuts them out and joins the
        pieces; `kernels.mosaic_codec.MosaicCodec.places` does both)."""
        return False
