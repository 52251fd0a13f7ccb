"""The Mosaic codec: encode, decode and one ring hop as Pallas kernels that stream through HBM.

XLA:TPU compiles the package's readable codec (`wire.encode`, `wire.decode`) into fusions that
read and write HBM many times over: libtpu counts 20-85x the fewest bytes for an encode at 1 MiB
(`runs/tpu_bytes.py`, stored in equarx_ref/data/tpu-bytes.json). Most of it is layout, not
arithmetic: a block of 32 values is a quarter of a 128-lane vector register, and XLA cannot
reduce 32-lane segments, or write rows of 34 bytes, without relayouts to padded tiles in HBM.

A kernel keeps those relayouts inside the core. These kernels walk a 2-D grid over a message of
rows: each grid step DMAs one tile from HBM into VMEM, codes it there with the package's own
codec (`wire_codec`, `wire.encode` and `wire.decode` in their Mosaic form, the same body the
fused hop and the ring kernel run) and DMAs the result tile back. The grid visits every tile of
every operand and result once, so what the kernel moves through HBM is its operands and results,
once each: the fewest bytes.

    encode  values [rows, m]                  -> wire bytes [rows, fmt.nbytes(m)]
    decode  wire bytes [rows, fmt.nbytes(m)]  -> values [rows, m]
    hop     (wire bytes, local values)        -> wire bytes: encode(decode(wire) + local), f32 sum

The bytes are the wire's (`spec.wire_bytes`): a row holds whole blocks, block after block, so
the rows laid end to end are the flat message `wire.encode` writes, bit for bit (tests/
test_conformance.py holds every kernel to the spec in TPU interpret mode). A tile is 8 rows by
128 blocks: 128 blocks of any format are a whole number of 128-byte lanes (`bytes_per_block` x
128), which Mosaic's block shapes need; a row of fewer values is one tile wide.

What this does not claim: the kernels compile for v5e and v6e (libtpu, from this CPU machine,
16 MiB of bf16; `equarx-ref kernels --compile`), and their HBM bytes are the fewest, but no TPU
has run them here, so nothing says the vector work inside keeps up with HBM. The ring kernel
(`ring.py`) still calls the codec on whole rows; this module is the codec a TPU user would call
per hop, and the measure of what a fused pass saves.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from .._checks import array, count, value_dtype
from ..formats import Format
from . import backend
from .hop import wire_codec

__all__ = ["TILE_BLOCKS", "TILE_ROWS", "decode", "encode", "hop"]

#: A tile: TILE_ROWS rows of TILE_BLOCKS blocks (fewer when a message has fewer).
TILE_ROWS, TILE_BLOCKS = 8, 128


def _format(fmt) -> Format:
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}")
    return fmt


def _grid(rows: int, m: int, fmt: Format, block_rows, block_cols) -> tuple[int, int]:
    """(rows, values) of one tile: the defaults, or the caller's, checked."""
    if m % fmt.block_size:
        raise ValueError(f"rows hold {m} values, not a multiple of block_size {fmt.block_size}")
    wide = TILE_BLOCKS * fmt.block_size
    if block_rows is None:
        block_rows = TILE_ROWS if rows % TILE_ROWS == 0 else rows
    if block_cols is None:
        block_cols = wide if m % wide == 0 else m
    count(block_rows, "block_rows")
    count(block_cols, "block_cols")
    if rows % block_rows:
        raise ValueError(f"block_rows={block_rows} does not divide rows={rows}")
    if m % block_cols or (block_cols != m and block_cols % wide):
        raise ValueError(f"block_cols={block_cols} must divide the row's {m} values and be a "
                         f"multiple of {wide} ({TILE_BLOCKS} blocks, whole 128-byte lanes) "
                         "or the whole row")
    return block_rows, block_cols


def _call(body, grid, in_specs, out_spec, out_shape, interpret, *operands):
    return pl.pallas_call(body, out_shape=out_shape, grid=grid, in_specs=in_specs,
                          out_specs=out_spec,
                          interpret=backend.interpret_params(interpret))(*operands)


def _specs(fmt: Format, tile: tuple[int, int]):
    """BlockSpecs of a values tile and of its wire bytes, at grid step (i, j)."""
    rows, cols = tile
    return (pl.BlockSpec((rows, cols), lambda i, j: (i, j)),
            pl.BlockSpec((rows, fmt.nbytes(cols)), lambda i, j: (i, j)))


def _values(x, name: str) -> jax.Array:
    x = array(x, name, floating=True)
    if x.ndim != 2:
        raise ValueError(f"{name} must be [rows, m], got shape {list(x.shape)}")
    return x


def _wire(w, fmt: Format, rows: int, m: int, what: str) -> jax.Array:
    w = array(w, "wire")
    if w.dtype != jnp.uint8 or w.shape != (rows, fmt.nbytes(m)):
        raise ValueError(f"wire must be uint8 [{rows}, {fmt.nbytes(m)}] ({what}), got "
                         f"{w.dtype}{list(w.shape)}")
    return w


def _encode_body(codec, x_ref, out_ref):
    out_ref[...] = codec.encode(x_ref[...])


def _decode_body(codec, cols, dtype, wire_ref, out_ref):
    out_ref[...] = codec.decode(wire_ref[...], cols, dtype)


def _hop_body(codec, cols, wire_ref, local_ref, out_ref):
    # bytes and local values in, the f32 sum stays on chip, the next message out
    out_ref[...] = codec.encode(codec.decode(wire_ref[...], cols) +
                                local_ref[...].astype(codec.acc))


def encode(x, fmt: Format, *, block_rows: int | None = None, block_cols: int | None = None,
           interpret=None) -> jax.Array:
    """Values `[rows, m]` (m whole blocks) -> uint8 `[rows, fmt.nbytes(m)]`, each row
    `wire.encode`'s bytes (round to nearest). `interpret` as `fused_hop`: None runs natively on
    a TPU, in TPU interpret mode elsewhere."""
    fmt, x = _format(fmt), _values(x, "x")
    rows, m = x.shape
    tile = _grid(rows, m, fmt, block_rows, block_cols)
    values, wire = _specs(fmt, tile)
    return _call(functools.partial(_encode_body, wire_codec(fmt, x.dtype)),
                 (rows // tile[0], m // tile[1]), [values], wire,
                 jax.ShapeDtypeStruct((rows, fmt.nbytes(m)), jnp.uint8), interpret, x)


def decode(wire, fmt: Format, m: int, dtype="float32", *, block_rows: int | None = None,
           block_cols: int | None = None, interpret=None) -> jax.Array:
    """uint8 `[rows, fmt.nbytes(m)]` -> `dtype` `[rows, m]`: `wire.decode` of each row."""
    fmt, dtype = _format(fmt), value_dtype(dtype)
    count(m, "m")
    w = array(wire, "wire")
    if w.ndim != 2:
        raise ValueError(f"wire must be [rows, bytes], got shape {list(w.shape)}")
    rows = w.shape[0]
    tile = _grid(rows, m, fmt, block_rows, block_cols)
    w = _wire(w, fmt, rows, m, f"{m} values of {fmt} a row")
    values, wire_spec = _specs(fmt, tile)
    codec = wire_codec(fmt, jnp.float32)
    return _call(functools.partial(_decode_body, codec, tile[1], dtype),
                 (rows // tile[0], m // tile[1]), [wire_spec], values,
                 jax.ShapeDtypeStruct((rows, m), dtype), interpret, w)


def hop(wire, local, fmt: Format, *, block_rows: int | None = None,
        block_cols: int | None = None, interpret=None) -> jax.Array:
    """One ring hop, `encode(decode(wire) + local)` with the sum in f32: wire uint8
    `[rows, fmt.nbytes(m)]` and local `[rows, m]` -> the next message, bitwise
    `kernels.hop_reference`'s."""
    fmt, local = _format(fmt), _values(local, "local")
    rows, m = local.shape
    tile = _grid(rows, m, fmt, block_rows, block_cols)
    w = _wire(wire, fmt, rows, m, f"{m} values of {fmt} for each of local's {rows} rows")
    values, wire_spec = _specs(fmt, tile)
    return _call(functools.partial(_hop_body, wire_codec(fmt, local.dtype), tile[1]),
                 (rows // tile[0], m // tile[1]), [wire_spec, values], wire_spec,
                 jax.ShapeDtypeStruct(w.shape, jnp.uint8), interpret, w, local)
