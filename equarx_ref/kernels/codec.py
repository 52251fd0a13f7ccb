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
once each: the fewest bytes. Each kernel declares that figure as its cost (`pl.CostEstimate`),
which XLA:TPU's count and `hlo_memory.kernel_io` take for it.

    encode  values [rows, m]                  -> wire bytes [rows, fmt.nbytes(m)]
    decode  wire bytes [rows, fmt.nbytes(m)]  -> values [rows, m]
    hop     (wire bytes, local values)        -> wire bytes: encode(decode(wire) + local), f32 sum
    reduce  p messages [p, rows, nbytes(m)]   -> the message of their sum, added in rank order
                                                 (two-shot's reduce step), f32 sum

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

Values travel lane-dense (`_dense`). XLA:TPU holds a flat array in tiles of 1024 values, 8 rows
of 128; a values operand `[rows, m]` is tiled (8, 128) across rows instead, and reaching it
from a flat chunk is a relayout through HBM, every value read and written once more, at every
call. So where a tile is whole rows filling whole tiles, the kernel takes the values as rows of
128, a bitcast of the flat array, and reshapes the tile into the message's rows in VMEM (an f32
tile through its int32 bits, `_reshaped`, where Mosaic would fold two reshapes into one it
cannot lay out). With the executor holding its input the same way (`row_codec.RowCodec.dense`),
that cut `all_reduce(impl="mosaic")`'s int8 ring from 6.8x psum's bytes to 3.8x (libtpu 0.0.42.1,
v5e, 1/4 MiB), and two-shot from 13.7x to 2.7x with its reduce step as one kernel.

Operands are read where they lie. A ring hop adds this device's chunk of the input, at a row
that depends on the device; cut out by a dynamic slice, the chunk is written to HBM before a
kernel can read it (a custom call cannot fuse a slice), 1x psum's bytes over a ring. So
`encode` and `hop` take the whole input and the first row (`first_row`, a scalar the index
maps read: `PrefetchScalarGridSpec`), and `decode` takes gathered messages with the order to
read them in (`order`) where the bidirectional ring transposed their bytes first (0.5x). XLA's
memory-space assignment then staged the whole input in VMEM before the hops, a copy as large
as the slices, unless the operand is pinned to HBM (`with_memory_space_constraint`). With
both, the int8 ring came to 2.79x psum's bytes and the bidirectional ring to 2.97x (from 3.80x
and 4.53x; libtpu 0.0.42.1, v5e, 1/4 MiB, `runs/tpu_bytes.py`'s count); the gather's one message
of both lanes' last sums (`hop(into=)`) later brought the bidirectional ring to 2.90x there (a
compile not stored; 2.78x at 1 MiB in tpu-bytes.json).

What this does not claim: the kernels compile for v5e and v6e (libtpu, from this CPU machine;
`equarx-ref kernels --compile`, family "codec": the `FORMATS` below, not the bit-packed odd
widths, whose packing Mosaic refuses as an unsupported shape cast), and their HBM bytes are the
fewest, but no TPU has run them here, so nothing says the vector work inside keeps up with HBM.
The ring kernel (`ring.py`) still calls the codec on whole rows. The collectives run on these
kernels with `all_reduce(impl="mosaic")`: `row_codec.RowCodec` is the executor's codec then,
each message a few rows of whole blocks (`row_codec.message_rows`), each hop one `hop` call and
two-shot's reduce step one `reduce` call.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._checks import array, count, value_dtype
from ..formats import Format
from ..quantize import rank_order_sum, zero_subnormals
from . import backend
from .hop import wire_codec

__all__ = ["FORMATS", "TILE_BLOCKS", "TILE_ROWS", "VMEM_LIMIT", "checked_format", "decode",
           "encode", "grid", "hop", "hop_tile", "reduce", "reduce_tile"]

#: A tile: TILE_ROWS rows of TILE_BLOCKS blocks (fewer where the message has fewer).
TILE_ROWS, TILE_BLOCKS = 8, 128
#: The formats the TPU compile tier compiles these kernels for (`equarx-ref kernels --compile`,
#: family "codec"), so the ones `equarx-ref check` runs them with.
FORMATS = ("int8", "int4", "fp8_e4m3", "fp8_e5m2", "mxfp8", "mxfp6_e2m3", "mxfp4", "int8/f32")
#: Scoped VMEM a kernel may use: 64 MiB, half of v5e's and v6e's 128 MiB.
VMEM_LIMIT = 64 << 20


def checked_format(fmt) -> Format:
    """`fmt`, checked to be a Format (the kernels take no raw bits: `fmt=None` is the XLA
    codec's)."""
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
    tile = _tile(count(rows, "rows"), count(m, "m"), checked_format(fmt), block_cols)
    return rows // tile[0], m // tile[1]


def _dense(tile: tuple[int, int], m: int) -> bool:
    """Whether a tile's values travel lane-dense: a tile of whole rows whose values fill whole
    (32, 128) tiles when read as rows of 128. Then the values go to the kernel as that view,
    `[values / 128, 128]`, which is how XLA:TPU already holds a flat array (its 1-D tiles are
    1024 values, 8 rows of 128), so the view is a bitcast; the kernel reshapes the tile into the
    message's rows in VMEM. Values taken as `[rows, m]` instead are tiled (8, 128) across rows,
    which XLA:TPU reaches from a flat chunk only by a relayout in HBM: one read and one write of
    every value, each time a collective hands a kernel a chunk."""
    rows, cols = tile
    return cols == m and (rows * cols) % (32 * 128) == 0


def _call(body, fmt: Format, tile, m: int, kinds: str, out_kind: str, out_dtype, interpret,
          *operands, first_row=None, message_rows=None, order=None, into=None):
    """The kernel over groups of `tile[0]` rows (a leading axis) and tiles along the row.
    `kinds` names each operand ("v": values `[rows, m]`, "w": wire bytes `[rows, nbytes(m)]`,
    "p": p such messages `[p, rows, nbytes(m)]`) and `out_kind` the result; values travel
    lane-dense where `_dense` says so, and a body reshapes a values tile to `tile` itself. The
    kernel declares what its grid moves, each block once, as its cost (`pl.CostEstimate`):
    XLA:TPU's count takes that figure for the kernel, and so does `hlo_memory.kernel_io`.

    With `first_row` (`(i, r, o)`: row i * r + o, i traced, a multiple of `tile[0]`), a values
    operand may hold more rows than the message (`message_rows`, else the first operand's): the
    kernel reads the message's rows from there on, where they lie (i is a prefetched scalar, and
    the index map's arithmetic runs in the kernel, outside XLA's count), so no slice of it is cut
    out first. That operand is kept in HBM (`with_memory_space_constraint`): XLA's memory-space
    assignment staged a whole ring's input in VMEM otherwise, a copy as large as the slices it
    saves (libtpu 0.0.42.1).

    With `order` (message indices, one per message of the result), a wire operand of
    `len(order)` messages is read message `order[i]` for the result's message i: the
    gathered messages decoded in result order, with no transposed copy of their bytes.

    With `into` (`(result, per, r, o)`), the result is a larger array of rows, `result` itself
    (written in place: an aliased operand) or, an int, the rows of a new one: row q of the
    message goes to row (q // per) r + o + q % per, messages of `per` rows each laid into it
    (whole tiles), and its other rows are left as they were (a new one's: unset). A pipeline's
    pieces are decoded into one result that way, not concatenated after."""
    rows, cols = tile
    groups = (message_rows or operands[0].shape[-2]) // rows
    dense = _dense(tile, m)
    per = None if order is None else groups // len(order)  # groups a message

    def group(g, at, kind):  # the group of an operand that grid step g reads
        if kind == "v" and first_row is not None:
            _, unit, offset = first_row
            if unit % rows == 0 and offset % rows == 0:
                return g + at[0][0] * (unit // rows) + offset // rows
            return g + (at[0][0] * unit + offset) // rows
        if kind == "w" and order is not None:
            return at[0][g // per] * per + g % per
        return g

    def shaped(kind, op=None, read=False):  # (shape, block shape, index map), grouped
        if kind == "p":  # p messages, one after another: [p, rows, nbytes(m)]
            p = operands[0].shape[0]
            return ((p, groups, rows, fmt.nbytes(m)), (p, None, rows, fmt.nbytes(cols)),
                    lambda g, j, *at: (0, g, 0, j))
        if kind == "w":
            return ((groups, rows, fmt.nbytes(m)), (None, rows, fmt.nbytes(cols)),
                    lambda g, j, *at: (group(g, at, kind) if read else g, 0, j))
        held = groups if op is None else op.size // (rows * m)  # groups the operand holds
        if dense:
            return ((held, rows * m // 128, 128), (None, rows * cols // 128, 128),
                    lambda g, j, *at: (group(g, at, kind) if read else g, 0, 0))
        return ((held, rows, m), (None, rows, cols),
                lambda g, j, *at: (group(g, at, kind) if read else g, 0, j))

    grouped = [op.reshape(shaped(kind, op)[0])
               for kind, op in zip(kinds, operands, strict=True)]
    varying = frozenset().union(*map(backend.varying, operands))  # shard_map's check_vma
    out_shape, *out_spec = shaped(out_kind)
    written = []  # the array the result is written into, aliased (`into`)
    if into is not None:  # the result's rows laid into a larger array, message by message
        target, *laid = into
        total = target if isinstance(target, int) else target.shape[0]  # rows
        out_shape = (total // rows, *out_shape[1:])
        each, r, o = (v // rows for v in laid)  # in groups: a message's, its stride, its offset
        block, place = out_spec
        out_spec = [block, lambda g, j, *at: (g // each * r + o + g % each,
                                              *place(g, j, *at)[1:])]
        if not isinstance(target, int):  # written in place: an aliased operand, never read
            varying |= backend.varying(target)
            written = [target.reshape(out_shape)]
            body = functools.partial(_skip_aliased, body)
    block_bytes = [math.prod(filter(None, shaped(kind)[1])) * jnp.dtype(dtype).itemsize
                   for kind, dtype in
                   (*zip(kinds, (op.dtype for op in operands), strict=True),
                    (out_kind, out_dtype))]
    specs = {"grid": (groups, m // cols),
             "in_specs": [*(pl.BlockSpec(*shaped(kind, read=True)[1:]) for kind in kinds),
                          *(pl.BlockSpec(memory_space=pl.ANY) for _ in written)],
             "out_specs": pl.BlockSpec(*out_spec)}
    interpret = backend.interpret_params(interpret)
    prefetched = ()
    if first_row is not None:  # the values' first group, read by the index maps
        prefetched = (jnp.asarray(first_row[0], jnp.int32).reshape(1),)
        if interpret is False:  # a compiler's placement (no interpreter runs the constraint)
            grouped = [pltpu.with_memory_space_constraint(op, pltpu.HBM) if kind == "v" else op
                       for kind, op in zip(kinds, grouped, strict=True)]
    elif order is not None:  # the message each result message reads
        prefetched = (jnp.asarray(order, jnp.int32),)
    if written and interpret is False and out_kind == "v":
        # a decoded result in HBM too, or XLA stages it in VMEM and copies it out after: a pass
        # over the whole result. A message laid into a buffer (`hop`) is left where XLA puts
        # it: pinned, it was copied into VMEM for the all-gather that sends it (libtpu
        # 0.0.42.1, a pipelined bidirectional int8 ring at 16 MiB per chip: 2.2 MB more)
        written = [pltpu.with_memory_space_constraint(written[0], pltpu.HBM)]
    if prefetched:
        specs = {"grid_spec": pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, **specs)}
        body = functools.partial(_skip_first, body)
    # the aliased array, the last operand, is the result (its index counts prefetched scalars)
    aliases = {len(prefetched) + len(grouped): 0} if written else {}
    out = pl.pallas_call(
        body, **specs, input_output_aliases=aliases,
        out_shape=backend.result_type(out_shape, out_dtype, varying),
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=VMEM_LIMIT),
        cost_estimate=pl.CostEstimate(flops=0, transcendentals=0,
                                      bytes_accessed=groups * (m // cols) * sum(block_bytes)),
        interpret=interpret)(*prefetched, *grouped, *written)
    return out.reshape(out_shape[0] * rows, -1)


def _first_row(first_row):
    """`first_row` as `(i, r, o)`, row i * r + o: from an index i, `(i, r)` or `(i, r, o)`."""
    if first_row is None:
        return None
    i, r, o = (*first_row, 0)[:3] if isinstance(first_row, tuple) else (first_row, 1, 0)
    return i, r, o


def _skip_first(body, _prefetched_ref, *refs):
    """A body under prefetched scalars: the index maps read them, the body does not."""
    return body(*refs)


def _skip_aliased(body, *refs):
    """A body writing into an aliased operand (`into`): it writes the result, never reads it."""
    return body(*refs[:-2], refs[-1])


def _check_into(into, rows: int, tile, width: int, dtype) -> None:
    """`into` (`(result, per, r, o)`, as `_call` lays a result of `rows` rows into it),
    refused in one line unless its rows are `dtype` `[rows', width]` and whole tiles, the
    messages inside it."""
    if into is None:
        return
    target, per, r, o = into
    total = target if isinstance(target, int) else target.shape[0]
    if isinstance(target, jax.Array) and \
            (target.shape[1:] != (width,) or target.dtype != dtype):
        raise ValueError(f"into must be {dtype.name} [rows, {width}], got "
                         f"{target.dtype}{list(target.shape)}")
    if any(v % tile[0] for v in (per, r, o, total)) or rows % per or \
            (rows // per - 1) * r + o + per > total:
        raise ValueError(f"into lays messages of {per} rows from row i * {r} + {o} of "
                         f"{total}: not whole tiles of {tile[0]} rows, or past its end")


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


def hop_tile(codec, cols: int, wire, local):
    """A hop on one tile: bytes and local values in, the f32 sum stays on chip, the next
    message out; a subnormal local value reads as a zero of its sign on every backend, as the
    collectives add it (execute.py `settle`; a decoded value is never subnormal)."""
    local = local.astype(codec.acc)
    local = zero_subnormals(local) if codec.acc == jnp.float32 else local
    return codec.encode(codec.decode(wire, cols) + local)


def _reshaped(values: jax.Array, shape) -> jax.Array:
    """`values.reshape(shape)` inside a kernel. An f32 tile goes through its int32 bits: Mosaic
    (libtpu 0.0.42.1) folds the codec's own reshape between rows and blocks, `[rows, cols]` <->
    `[rows, blocks, block]`, and this one into a single shape cast between
    `[rows * cols / 128, 128]` and `[rows, blocks, block]` that it cannot lay out, and a
    bitcast between them keeps the two apart (a bf16 tile has its `astype` there)."""
    if values.shape == tuple(shape) or values.dtype != jnp.float32:
        return values.reshape(shape)
    bits = lax.bitcast_convert_type(values, jnp.int32).reshape(shape)
    return lax.bitcast_convert_type(bits, jnp.float32)


def _encode_body(codec, tile, x_ref, out_ref):
    out_ref[...] = codec.encode(_reshaped(x_ref[...], tile))


def _decode_body(codec, tile, dtype, wire_ref, out_ref):
    out_ref[...] = _reshaped(codec.decode(wire_ref[...], tile[1], dtype), out_ref.shape)


def _hop_body(codec, tile, wire_ref, local_ref, out_ref):
    out_ref[...] = hop_tile(codec, tile[1], wire_ref[...], _reshaped(local_ref[...], tile))


def reduce_tile(codec, cols: int, messages):
    """Two-shot's reduce on one tile: p messages in, added in rank order in f32 (each partial
    sum's subnormals read as zeros of their sign; a decoded value is never subnormal), the
    sum's message out."""
    return codec.encode(rank_order_sum([codec.decode(m, cols) for m in messages],
                                       zero_subnormals))


def _reduce_body(codec, tile, wire_ref, out_ref):
    out_ref[...] = reduce_tile(codec, tile[1], [wire_ref[r] for r in range(wire_ref.shape[0])])


def encode(x, fmt: Format, *, rows: int | None = None, first_row=None,
           block_cols: int | None = None, interpret=None) -> jax.Array:
    """Values `[rows, m]` (m whole blocks; up to 8 rows, or a multiple of 8) -> uint8
    `[rows, fmt.nbytes(m)]`, each row `wire.encode`'s bytes (round to nearest). With `rows`
    and `first_row` (an index, traced or not, or `(i, r[, o])` for row i * r + o; a multiple
    of the tile's rows), x may hold more rows: the kernel encodes `rows` rows from there, where
    they lie. `block_cols`: values of a tile's row. `interpret` as `fused_hop`: None runs natively
    on a TPU, in TPU interpret mode elsewhere."""
    fmt, x = checked_format(fmt), _values(x, "x")
    m = x.shape[1]
    if (rows is None) != (first_row is None):
        raise ValueError("encode takes rows= and first_row= together, or neither")
    rows = x.shape[0] if rows is None else count(rows, "rows")
    tile = _tile(rows, m, fmt, block_cols)
    if first_row is not None and x.shape[0] % tile[0]:
        raise ValueError(f"x holds {x.shape[0]} rows, not whole tiles of {tile[0]}")
    return _call(functools.partial(_encode_body, wire_codec(fmt, x.dtype), tile), fmt, tile, m,
                 "v", "w", jnp.uint8, interpret, x, first_row=_first_row(first_row),
                 message_rows=rows)


def decode(wire, fmt: Format, m: int, dtype="float32", *, order=None, into=None,
           block_cols: int | None = None, interpret=None) -> jax.Array:
    """uint8 `[rows, fmt.nbytes(m)]` -> `dtype` `[rows, m]`: `wire.decode` of each row. With
    `order` (a permutation of message indices; a message is `rows / len(order)` rows, whole
    tiles of 8), the result's message i is the decode of message `order[i]`, read where it
    lies. With `into` (`(result, per, r, o)`: result an array `[rows', m]` or a count of rows
    for a new one), the decoded rows are laid into it, messages of `per` rows each, message i
    from row i * r + o (all multiples of the tile's rows), the rest of it left as it was (a new
    one's unset): `result` is returned, written in place."""
    fmt, dtype = checked_format(fmt), value_dtype(dtype)
    count(m, "m")
    w = array(wire, "wire")
    if w.ndim != 2:
        raise ValueError(f"wire must be [rows, bytes], got shape {list(w.shape)}")
    rows = w.shape[0]
    tile = _tile(rows, m, fmt, block_cols)
    if order is not None and (sorted(order) != list(range(len(order))) or
                              rows % (len(order) * tile[0])):
        raise ValueError(f"order must permute whole messages of whole tiles of {tile[0]} rows: "
                         f"{len(order)} messages of {rows} rows in all")
    _check_into(into, rows, tile, m, dtype)
    w = _wire(w, fmt, rows, m, f"{m} values of {fmt} a row")
    codec = wire_codec(fmt, jnp.float32)
    return _call(functools.partial(_decode_body, codec, tile, dtype), fmt, tile, m, "w", "v",
                 dtype, interpret, w, order=None if order is None else tuple(order), into=into)


def hop(wire, local, fmt: Format, *, first_row=None, into=None,
        block_cols: int | None = None, interpret=None) -> jax.Array:
    """One ring hop, `encode(decode(wire) + local)` with the sum in f32: wire uint8
    `[rows, fmt.nbytes(m)]` and local `[rows, m]` -> the next message, bitwise
    `kernels.hop_reference`'s. With `first_row` (an index, traced or not, or `(i, r[, o])` for
    row i * r + o; a multiple of the tile's rows: of 8 when the message has 8 or more), local may
    hold more rows, and the kernel adds the wire's count of rows from there, where they lie,
    cutting nothing out first. With `into` (as `decode`'s, a uint8 result of message rows),
    the message's rows are laid into a larger buffer, not joined to others after."""
    fmt, local = checked_format(fmt), _values(local, "local")
    m = local.shape[1]
    rows = array(wire, "wire").shape[0] if first_row is not None else local.shape[0]
    tile = _tile(rows, m, fmt, block_cols)
    if first_row is not None and local.shape[0] % tile[0]:
        raise ValueError(f"local holds {local.shape[0]} rows, not whole tiles of {tile[0]}")
    w = _wire(wire, fmt, rows, m, f"{m} values of {fmt} for each of {rows} rows")
    _check_into(into, rows, tile, fmt.nbytes(m), jnp.dtype(jnp.uint8))
    return _call(functools.partial(_hop_body, wire_codec(fmt, local.dtype), tile), fmt, tile,
                 m, "wv", "w", jnp.uint8, interpret, w, local, first_row=_first_row(first_row),
                 into=into)


def reduce(wire, fmt: Format, m: int, *, block_cols: int | None = None,
           interpret=None) -> jax.Array:
    """Two-shot's reduce step: p messages of `m` values a row, uint8 `[p, rows,
    fmt.nbytes(m)]`, -> the message of their sum, `[rows, fmt.nbytes(m)]`: decoded and added in
    rank order in f32, each partial sum's subnormals read as zeros of their sign (as the
    collectives add them, execute.py `settle`), then encoded; one pass, the p messages in and
    one out, no f32 sum in HBM."""
    fmt = checked_format(fmt)
    count(m, "m")
    w = array(wire, "wire")
    if w.ndim != 3 or w.dtype != jnp.uint8 or w.shape[2] != fmt.nbytes(m):
        raise ValueError(f"wire must be uint8 [p, rows, {fmt.nbytes(m)}] ({m} values of {fmt} "
                         f"a row), got {w.dtype}{list(w.shape)}")
    tile = _tile(w.shape[1], m, fmt, block_cols)
    return _call(functools.partial(_reduce_body, wire_codec(fmt, jnp.float32), tile), fmt,
                 tile, m, "p", "w", jnp.uint8, interpret, w)
