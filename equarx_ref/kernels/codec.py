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
128 blocks: a message of more rows is taken as groups of 8 (its rows a multiple of 8), one of
fewer as one group, and a row shorter than 128 blocks, or not a multiple of them, is one tile
wide. Mosaic needs a tile's last two dimensions to be whole tiles of the array's layout or the
whole dimension: 8 rows is a whole group, and 128 blocks of any format are a whole number of
128-byte lanes (`bytes_per_block` x 128). The codec's intermediates on a tile are many times
the tile: 32 rows of 128 int8 blocks passed v5e's default 16 MiB of scoped VMEM, and a 6-bit
MX tile of 8 rows did too, so the kernels may use 64 MiB (`VMEM_LIMIT`, half of v5e's and
v6e's VMEM; libtpu 0.0.42.1).

What this does not claim: the kernels compile for v5e and v6e (libtpu, from this CPU machine;
`equarx-ref kernels --compile`, family "codec": the `FORMATS` below, not the bit-packed odd
widths, whose packing Mosaic refuses as an unsupported shape cast), and their HBM bytes are the
fewest, but no TPU has run them here, so nothing says the vector work inside keeps up with HBM.
The ring kernel (`ring.py`) still calls the codec on whole rows, and the collectives the XLA
path's codec; this module is the codec a TPU user would call per hop, and the measure of what a
fused pass saves.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._checks import array, count, value_dtype
from ..formats import Format
from . import backend
from .hop import wire_codec

__all__ = ["FORMATS", "TILE_BLOCKS", "TILE_ROWS", "VMEM_LIMIT", "decode", "encode", "grid",
           "hop"]

#: A tile: TILE_ROWS rows of TILE_BLOCKS blocks (fewer where the message has fewer).
TILE_ROWS, TILE_BLOCKS = 8, 128
#: The formats the TPU compile tier compiles these kernels for (`equarx-ref kernels --compile`,
#: family "codec"), so the ones `equarx-ref check` runs them with.
FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp6_e2m3", "mxfp4", "int8/f32")
#: Scoped VMEM a kernel may use: 64 MiB, half of v5e's and v6e's 128 MiB.
VMEM_LIMIT = 64 << 20


def _format(fmt) -> Format:
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}")
    return fmt


def _tile(rows: int, m: int, fmt: Format, block_cols) -> tuple[int, int]:
    """(rows, values) of one tile: a group of up to 8 rows, and the default or the caller's
    width, checked."""
    if m % fmt.block_size:
        raise ValueError(f"rows hold {m} values, not a multiple of block_size {fmt.block_size}")
    if rows > TILE_ROWS and rows % TILE_ROWS:
        raise ValueError(f"a message of more than {TILE_ROWS} rows is taken {TILE_ROWS} rows at "
                         f"a time: {rows} rows is not a multiple of {TILE_ROWS}")
    wide = TILE_BLOCKS * fmt.block_size
    if block_cols is None:
        block_cols = wide if m % wide == 0 else m
    count(block_cols, "block_cols")
    if m % block_cols or (block_cols != m and block_cols % wide):
        raise ValueError(f"block_cols={block_cols} must divide the row's {m} values and be a "
                         f"multiple of {wide} ({TILE_BLOCKS} blocks, whole 128-byte lanes) "
                         "or the whole row")
    return min(rows, TILE_ROWS), block_cols


def grid(rows: int, m: int, fmt: Format, *, block_cols: int | None = None) -> tuple[int, int]:
    """The kernels' grid on a message of `rows` rows of `m` values of `fmt`: (groups of rows,
    tiles along a row); each step moves one tile in and one out."""
    tile = _tile(count(rows, "rows"), count(m, "m"), _format(fmt), block_cols)
    return rows // tile[0], m // tile[1]


def _call(body, tile, m: int, in_specs, out_spec, out_shape, interpret, *operands):
    """The kernel over groups of `tile[0]` rows (a leading axis) and tiles along the row;
    operands and result `[rows, ...]`, viewed as `[groups, tile[0], ...]`."""
    rows = operands[0].shape[0]
    groups = rows // tile[0]
    grouped = [op.reshape(groups, tile[0], op.shape[1]) for op in operands]
    out = pl.pallas_call(
        body, grid=(groups, m // tile[1]), in_specs=in_specs, out_specs=out_spec,
        out_shape=jax.ShapeDtypeStruct((groups, tile[0], out_shape.shape[1]), out_shape.dtype),
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=VMEM_LIMIT),
        interpret=backend.interpret_params(interpret))(*grouped)
    return out.reshape(out_shape.shape)


def _specs(fmt: Format, tile: tuple[int, int]):
    """BlockSpecs of a values tile and of its wire bytes, at grid step (group g, tile j)."""
    rows, cols = tile
    return (pl.BlockSpec((None, rows, cols), lambda g, j: (g, 0, j)),
            pl.BlockSpec((None, rows, fmt.nbytes(cols)), lambda g, j: (g, 0, j)))


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


def encode(x, fmt: Format, *, block_cols: int | None = None, interpret=None) -> jax.Array:
    """Values `[rows, m]` (m whole blocks; up to 8 rows, or a multiple of 8) -> uint8
    `[rows, fmt.nbytes(m)]`, each row `wire.encode`'s bytes (round to nearest). `block_cols`:
    values of a tile's row. `interpret` as `fused_hop`: None runs natively on a TPU, in TPU
    interpret mode elsewhere."""
    fmt, x = _format(fmt), _values(x, "x")
    rows, m = x.shape
    tile = _tile(rows, m, fmt, block_cols)
    values, wire = _specs(fmt, tile)
    return _call(functools.partial(_encode_body, wire_codec(fmt, x.dtype)), tile, m, [values],
                 wire, jax.ShapeDtypeStruct((rows, fmt.nbytes(m)), jnp.uint8), interpret, x)


def decode(wire, fmt: Format, m: int, dtype="float32", *, block_cols: int | None = None,
           interpret=None) -> jax.Array:
    """uint8 `[rows, fmt.nbytes(m)]` -> `dtype` `[rows, m]`: `wire.decode` of each row."""
    fmt, dtype = _format(fmt), value_dtype(dtype)
    count(m, "m")
    w = array(wire, "wire")
    if w.ndim != 2:
        raise ValueError(f"wire must be [rows, bytes], got shape {list(w.shape)}")
    rows = w.shape[0]
    tile = _tile(rows, m, fmt, block_cols)
    w = _wire(w, fmt, rows, m, f"{m} values of {fmt} a row")
    values, wire_spec = _specs(fmt, tile)
    codec = wire_codec(fmt, jnp.float32)
    return _call(functools.partial(_decode_body, codec, tile[1], dtype), tile, m, [wire_spec],
                 values, jax.ShapeDtypeStruct((rows, m), dtype), interpret, w)


def hop(wire, local, fmt: Format, *, block_cols: int | None = None,
        interpret=None) -> jax.Array:
    """One ring hop, `encode(decode(wire) + local)` with the sum in f32: wire uint8
    `[rows, fmt.nbytes(m)]` and local `[rows, m]` -> the next message, bitwise
    `kernels.hop_reference`'s."""
    fmt, local = _format(fmt), _values(local, "local")
    rows, m = local.shape
    tile = _tile(rows, m, fmt, block_cols)
    w = _wire(wire, fmt, rows, m, f"{m} values of {fmt} for each of local's {rows} rows")
    values, wire_spec = _specs(fmt, tile)
    return _call(functools.partial(_hop_body, wire_codec(fmt, local.dtype), tile[1]), tile, m,
                 [wire_spec, values], wire_spec, jax.ShapeDtypeStruct(w.shape, jnp.uint8),
                 interpret, w, local)
