"""The Mosaic codec: encode, decode, a ring hop and two-shot's reduce as Pallas TPU kernels.

Each kernel streams a message through HBM in tiles of T rows (a row is 128 values, a lane of
the message; T = 1024 where the message allows, else a divisor of it) and codes each tile in
registers with the tile code (`tiles.py`: one transpose a 128-row tile, blocks down
sublanes):

    encode   values [rows, 128]                    -> message ([G PB, rows], [G, rows])
    decode   message                               -> values [rows, 128]
    hop      (message, local values [rows, 128])   -> the next message: encode(decode + local)
    reduce   p messages ([p, G PB, rows], ...)     -> the message of their sum, rank order

Values are read and written as rows of 128, a bitcast of a flat array on a TPU (XLA:TPU holds
a flat array in tiles of 8 rows of 128), so no relayout goes through HBM; the message's two
arrays are lane-dense by their definition (spec/wire.py). Every block of every operand and
result is moved once: a kernel's HBM traffic is its fewest bytes. Its compute is what libtpu
schedules for the tile code, read back from the bundle listing (`models/bundles.py`,
`runs/tpu_schedule.py`), and each kernel's cost estimate (`pl.CostEstimate`) is only what it
declares: its blocks' bytes, labelled as declared wherever it is shown.

Operands are read where they lie and results written into place, so that a collective never
cuts a slice out for a kernel (XLA:TPU writes a slice that feeds a custom call to HBM first):

    first_row   a values operand's rows start at row r of a larger array, r a whole tile
                (an index, traced or not: a prefetched scalar the index maps read), or at
                row i a + o for `(i, a[, o])`, i an index and a and o whole tiles
    stride      with a message of `count` chunks, chunk c's rows start `stride` rows further
    order       decode: result chunk c reads message order[c] of a stack of messages
    into        the result laid into a larger array: a message's lanes at a lane offset of a
                larger message (written in place, aliased), or decoded rows at rows
                (c b + o) of a larger values array

A message with a leading axis (`[count, G PB, r]`) is `count` chunks' messages side by side in
memory; without one, `count` chunks are one message of `count r` lanes. `MosaicCodec`
(mosaic_codec.py) drives these kernels for the collectives (`all_reduce(..., impl="mosaic")`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._checks import array, value_dtype
from .._checks import count as checked_count
from ..formats import Format
from ..wire import Message, message_shapes
from . import backend, tiles

__all__ = ["ROWS", "VMEM_LIMIT", "checked_format", "decode", "encode", "hop", "reduce", "takes",
           "tile_rows"]

#: Rows (lanes of the message) a grid step codes, where the message has that many: 8 tiles of
#: 128, enough independent work for the scheduler to fill the bundles (fewer tiles leave them
#: emptier: libtpu's schedule of the hops, `runs/tpu_schedule.py`, data/tpu-schedule.json).
ROWS = 1024
#: Scoped VMEM a kernel may use: 64 MiB, half of v5e's and v6e's 128 MiB.
VMEM_LIMIT = 64 << 20
_SCALE_BITS = {"bfloat16": jnp.uint16, "float32": jnp.uint32, "e8m0": jnp.uint8}


def checked_format(fmt) -> Format:
    """`fmt`, checked to be a format the kernels code (`tiles.supports`)."""
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {type(fmt).__name__}")
    if not tiles.supports(fmt):
        raise ValueError(f"the Mosaic codec takes 8-bit and 4-bit elements in blocks that "
                         f"divide 128 (of 8 or 16 values at least); {fmt} is not one")
    return fmt


def tile_rows(rows: int) -> int | None:
    """T, the rows a grid step codes in a message of `rows` rows: `ROWS` (or a half, a
    quarter, an eighth of it) where it divides them, else all of them when they are whole
    16-row groups (a bf16 register's) of at most `ROWS`; None when neither (the XLA codec then
    carries the message: the same bytes)."""
    for t in (ROWS, ROWS // 2, ROWS // 4, ROWS // 8):
        if rows % t == 0:
            return t
    return rows if rows <= ROWS and rows % 16 == 0 else None


def takes(fmt, m: int) -> bool:
    """Whether the kernels code a message of `m` values of `fmt`."""
    return tiles.supports(fmt) and m % 128 == 0 and tile_rows(m // 128) is not None


def _tile(rows: int, *at: int) -> int:
    t = tile_rows(rows)
    if t is None:
        raise ValueError(f"the Mosaic codec codes messages of whole tiles: {rows} rows is not "
                         f"a multiple of 128, nor a multiple of 16 up to {ROWS}")
    if any(a % t for a in at):
        raise ValueError(f"rows are read and written at offsets of whole tiles of {t} rows; "
                         f"got {at}")
    return t


def _values(x, name: str) -> jax.Array:
    x = array(x, name, floating=True)
    if x.ndim != 2 or x.shape[1] != 128:
        raise ValueError(f"{name} must be rows of 128 values, [rows, 128], got "
                         f"{list(x.shape)}")
    return x


def _message(message, fmt: Format, name: str = "message") -> Message:
    """A message of `fmt`, checked: (payload uint8 [..., G PB, r], scales [..., G, r])."""
    if not isinstance(message, Message) or message.scales is None:
        raise TypeError(f"{name} must be an equarx_ref.wire.Message of {fmt} (payload and "
                        f"scales), got {type(message).__name__}")
    payload, scales = array(message.payload, f"{name}.payload"), array(message.scales,
                                                                         f"{name}.scales")
    (pb, _), (g, _) = message_shapes(fmt.row, fmt)
    if payload.ndim not in (2, 3) or payload.dtype != jnp.uint8 or payload.shape[-2] != pb or \
            scales.shape != (*payload.shape[:-2], g, payload.shape[-1]) or \
            scales.dtype != _SCALE_BITS[fmt.scale_dtype]:
        raise ValueError(f"{name} must be uint8 [..., {pb}, rows] and "
                         f"{jnp.dtype(_SCALE_BITS[fmt.scale_dtype]).name}[..., {g}, rows] "
                         f"({fmt}), got {payload.dtype}{list(payload.shape)} and "
                         f"{scales.dtype}{list(scales.shape)}")
    return Message(payload, scales)


def _row_index(value, what: str):
    """A row index: a Python or NumPy integer >= 0 (returned as an int), or a 0-d integer
    array, traced or not (returned as it is)."""
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{what} must be a row index (an integer, or a 0-d integer array), "
                        f"got {value!r}")
    if isinstance(value, (int, np.integer)):
        return checked_count(value, what, minimum=0)
    dtype, shape = getattr(value, "dtype", None), getattr(value, "shape", None)
    if dtype is None or shape is None:
        got = repr(value)
    elif shape != () or not jnp.issubdtype(dtype, jnp.integer):
        got = f"an array {dtype}{list(shape)}"
    else:
        return value
    raise TypeError(f"{what} must be a row index (an integer, or a 0-d integer array), got "
                    f"{got}"[:300])


def _known(index) -> int | None:
    """A row index's value where it is known when tracing, else None."""
    try:
        return int(index)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return None


def _first_row(first_row):
    """`first_row` as `(i, a, o)` (row i a + o) and the offsets that must be whole tiles: for
    an index r, (r, 1, 0) and r itself where it is known; for `(i, a[, o])`, a and o. Anything
    else is refused in one line."""
    if first_row is None:
        return None, ()
    if isinstance(first_row, tuple):
        if len(first_row) not in (2, 3):
            raise TypeError(f"first_row must be a row index or a tuple (i, a[, o]) for row "
                            f"i a + o, got a tuple of {len(first_row)}")
        i = _row_index(first_row[0], "first_row's i")
        a = checked_count(first_row[1], "first_row's a", minimum=0)
        o = checked_count(first_row[2], "first_row's o", minimum=0) if len(first_row) == 3 \
            else 0
        return (i, a, o), (a, o)
    r = _row_index(first_row, "first_row")
    known = _known(r)
    return (r, 1, 0), (() if known is None else (known,))


def _call(body, fmt: Format, t: int, count: int, rows: int, *, values=None, messages=(),
          stack=None, result, interpret, first_row=None, stride=0, order=None, into=None,
          stacked_result=False):
    """One kernel over a grid (count chunks, rows / t tiles a chunk).

    `values`: a values operand `[X, 128]`; chunk c's rows from row (i a + o) + c stride
    (`first_row`) or c rows. `messages`: message operands, each `[count?, P, r]` (3-D: chunk
    c is message c, or `order[c]`; 2-D: chunk c is lanes c r ..). `stack`: p messages
    `[p, P, r]` read whole at each tile (two-shot's reduce). `result`: "message" or a values
    dtype; `into`: where it goes (module essay)."""
    steps = rows // t
    prefetched = ()
    varying = frozenset()
    in_specs, operands = [], []

    def value_block(c, i, s):  # the row block of chunk c, tile i
        if first_row is None:
            return c * steps + i
        _, a, o = first_row
        return (s[0][0] * a + o + c * stride) // t + i

    if order is not None:
        prefetched = (jnp.asarray(order, jnp.int32),)
    if values is not None:
        if first_row is not None:
            prefetched = (jnp.asarray(first_row[0], jnp.int32).reshape(1),)
            if backend.interpret_params(interpret) is False:  # read where it lies, in HBM
                values = pltpu.with_memory_space_constraint(values, pltpu.HBM)
        in_specs.append(pl.BlockSpec((t, 128), lambda c, i, *s: (value_block(c, i, s), 0)))
        operands.append(values)
        varying |= backend.varying(values)
    for m in messages:
        for a in m:
            three = a.ndim == 3
            if three:  # chunk c is message c, or order[c] (a prefetched table)
                spec = pl.BlockSpec((None, a.shape[1], t), lambda c, i, *s: (
                    s[0][c] if order is not None else c, 0, i))
            else:
                spec = pl.BlockSpec((a.shape[0], t), lambda c, i, *s: (0, c * steps + i))
            in_specs.append(spec)
            operands.append(a)
            varying |= backend.varying(a)
    if stack is not None:
        for a in stack:
            in_specs.append(pl.BlockSpec((a.shape[0], a.shape[1], t),
                                         lambda c, i, *s: (0, 0, i)))
            operands.append(a)
            varying |= backend.varying(a)

    (pb, _), (g, _) = message_shapes(fmt.row, fmt)
    aliases, written = {}, []
    if result == "message":  # flat: chunk c at lanes c rows; stacked: message c of a stack
        stacked, total, offset = False, count, 0
        if into is not None:  # a larger message, or a new one (a count of chunks)
            target, offset = into
            if isinstance(target, int):
                stacked, total = stacked_result, target
            else:
                stacked = target.payload.ndim == 3
                total = target.payload.shape[0] if stacked else \
                    target.payload.shape[-1] // rows
                written = list(target)
                varying |= backend.varying(target.payload)
        else:
            stacked = stacked_result
        if stacked:
            shapes = [(total, pb, rows), (total, g, rows)]
            out_specs = [pl.BlockSpec((None, n, t), lambda c, i, *s: (offset + c, 0, i))
                         for n in (pb, g)]
        else:
            shapes = [(pb, total * rows), (g, total * rows)]
            out_specs = [pl.BlockSpec((n, t), lambda c, i, *s: (0, (offset + c) * steps + i))
                         for n in (pb, g)]
        dtypes = [jnp.uint8, _SCALE_BITS[fmt.scale_dtype]]
    else:
        out_rows, place = count * rows, (lambda c: c * rows)
        if into is not None:  # rows (c b + o) of a larger values array
            target, b, o = into
            out_rows = target if isinstance(target, int) else target.shape[0]
            place = lambda c, b=b, o=o: c * b + o  # noqa: E731
            if not isinstance(target, int):
                written = [target]
                varying |= backend.varying(target)
        shapes, dtypes = [(out_rows, 128)], [result]
        out_specs = [pl.BlockSpec((t, 128), lambda c, i, *s: (place(c) // t + i, 0))]
    if written:  # aliased operands, never read: the result is written over them
        in_specs += [pl.BlockSpec(memory_space=pl.ANY) for _ in written]
        base = len(prefetched) + len(operands)
        aliases = {base + k: k for k in range(len(written))}
        inner, n_in = body, len(operands)
        body = lambda *refs: inner(*refs[:n_in], *refs[n_in + len(written):])  # noqa: E731
    if prefetched:
        inner_p = body
        body = lambda _s, *refs: inner_p(*refs)  # noqa: E731  (the index maps read it)
    specs = {"grid": (count, steps), "in_specs": in_specs, "out_specs": out_specs}
    if prefetched:
        specs = {"grid_spec": pltpu.PrefetchScalarGridSpec(num_scalar_prefetch=1, **specs)}
    # what the grid moves, each block once: the kernel's declared cost (a declaration, not
    # a measurement: runs/tpu_schedule.py reads the chip's schedule for its compute)
    lanes_read = count * rows
    moved = (lanes_read * 128 * values.dtype.itemsize if values is not None else 0) + \
        sum(lanes_read * a.shape[-2] * a.dtype.itemsize for m in messages for a in m) + \
        (sum(a.shape[0] * a.shape[1] * rows * a.dtype.itemsize for a in stack)
         if stack is not None else 0) + \
        sum(lanes_read * (sh[-2] if result == "message" else 128) * jnp.dtype(d).itemsize
            for sh, d in zip(shapes, dtypes, strict=True))
    out = pl.pallas_call(
        body, **specs, input_output_aliases=aliases,
        out_shape=[backend.result_type(s, d, varying, in_hbm=result != "message")
                   for s, d in zip(shapes, dtypes, strict=True)],
        compiler_params=pltpu.CompilerParams(vmem_limit_bytes=VMEM_LIMIT),
        cost_estimate=pl.CostEstimate(flops=0, transcendentals=0, bytes_accessed=moved),
        interpret=backend.interpret_params(interpret))(*prefetched, *operands, *written)
    return Message(*out) if result == "message" else out[0]


def _encode_body(fmt, x_ref, p_ref, s_ref):
    m = tiles.encode(x_ref[...], fmt)
    p_ref[...], s_ref[...] = m.payload, m.scales


def _decode_body(fmt, dtype, p_ref, s_ref, o_ref):
    o_ref[...] = tiles.decode(Message(p_ref[...], s_ref[...]), fmt, dtype)


def _hop_body(fmt, x_ref, p_ref, s_ref, po_ref, so_ref):
    m = tiles.hop(Message(p_ref[...], s_ref[...]), x_ref[...], fmt, flushes=True)
    po_ref[...], so_ref[...] = m.payload, m.scales


def _reduce_body(fmt, p_ref, s_ref, po_ref, so_ref):
    m = tiles.reduce([Message(p_ref[r], s_ref[r]) for r in range(p_ref.shape[0])], fmt,
                     flushes=True)
    po_ref[...], so_ref[...] = m.payload, m.scales


def _chunks(x_rows: int, rows: int | None, count: int, first_row) -> tuple[int, int]:
    """(rows of a chunk, chunks) of a values operand read from `first_row`."""
    checked_count(count, "count")
    if rows is None:
        if first_row is not None:
            raise ValueError("rows= says how many rows to read from first_row")
        if x_rows % count:
            raise ValueError(f"{x_rows} rows are not {count} chunks of whole rows")
        return x_rows // count, count
    return checked_count(rows, "rows"), count


def encode(x, fmt: Format, *, rows: int | None = None, count: int = 1, first_row=None,
           stride: int | None = None, stacked: bool = False, into=None,
           interpret=None) -> Message:
    """Values `[X, 128]` -> the message of `count` chunks of `rows` rows each (default: all
    of x, `count` equal chunks): one message of `count rows` lanes, or with `stacked` a stack
    `[count, G PB, rows]`. With `first_row` (row r: an index, an integer or a 0-d integer array,
    traced or not, a whole number of tiles of `tile_rows(rows)` rows, checked where it is
    known, a traced one read from tile r // T; or `(i, a[, o])` for row i a + o, i an index
    and a and o whole tiles) chunk c is read from there plus c `stride` rows (default
    `rows`), where it lies.
    With `into` (`(message, chunk)`), the chunks are written over a larger message (flat or
    stacked) from chunk `chunk` on, in place, and that is returned; `(chunks, chunk)` makes a
    new one of `chunks` chunks whose others are left unset. `interpret`: None runs natively
    on a TPU, in TPU interpret mode elsewhere."""
    fmt, x = checked_format(fmt), _values(x, "x")
    rows, count = _chunks(x.shape[0], rows, count, first_row)
    first, whole = _first_row(first_row)
    stride = rows if stride is None else stride
    t = _tile(rows, stride, *whole)
    return _call(functools.partial(_encode_body, fmt), fmt, t, count, rows, values=x,
                 result="message", interpret=interpret, first_row=first, stride=stride,
                 into=_check_message_into(into, fmt, count, rows), stacked_result=stacked)


def decode(message, fmt: Format, dtype="float32", *, order=None, into=None,
           interpret=None) -> jax.Array:
    """A message -> values `[count r, 128]` in `dtype`, chunk after chunk. A message with a
    leading axis (`[count, G PB, r]`) is `count` chunks, read in `order` (message `order[c]`
    for chunk c) where given. With `into` (`(values or a row count, b, o)`), chunk c's rows go
    to rows c b + o of a larger values array (written in place) or a new one (its other rows
    unset), which is returned."""
    fmt, dtype = checked_format(fmt), value_dtype(dtype)
    message = _message(message, fmt)
    three = message.payload.ndim == 3
    count = message.payload.shape[0] if three else 1
    rows = message.payload.shape[-1]
    if order is not None:
        if not three or sorted(order) != list(range(count)):
            raise ValueError(f"order must permute the {count} messages of a stack "
                             f"[count, ...], got {tuple(order)}")
    t = _tile(rows, *((into[1], into[2]) if into is not None else ()))
    if into is not None:
        target, b, o = into
        total = target if isinstance(target, int) else target.shape[0]
        if not isinstance(target, int) and (target.shape[1:] != (128,) or
                                            target.dtype != dtype):
            raise ValueError(f"into must be {dtype.name} rows [rows, 128], got "
                             f"{target.dtype}{list(target.shape)}")
        if (count - 1) * b + o + rows > total:
            raise ValueError(f"into lays {count} chunks of {rows} rows from row c {b} + {o}: "
                             f"past its {total} rows")
    return _call(functools.partial(_decode_body, fmt, dtype), fmt, t, count, rows,
                 messages=[message], result=dtype, interpret=interpret, order=order,
                 into=into)


def hop(message, local, fmt: Format, *, count: int | None = None, first_row=None,
        stride: int | None = None, stacked: bool = False, into=None,
        interpret=None) -> Message:
    """One ring hop, `encode(decode(message) + local)`, the sum in f32: a message of chunks
    (one of their lanes side by side, or a stack `[count, G PB, r]`) and their local values ->
    the next message (flat, or with `stacked` a stack). A flat message is `count` chunks
    (default 1) side by side. With `first_row` (as `encode`'s), local holds more rows and
    chunk c's are read from there plus c `stride` rows (default: a chunk's rows); with
    `into`, as `encode`'s."""
    fmt, local = checked_format(fmt), _values(local, "local")
    message = _message(message, fmt)
    three = message.payload.ndim == 3
    lanes = message.payload.shape[-1]
    if three:
        if count not in (None, message.payload.shape[0]):
            raise ValueError(f"a stack of {message.payload.shape[0]} messages is that many "
                             f"chunks, not count={count}")
        count = message.payload.shape[0]
    count = checked_count(1 if count is None else count, "count")
    if lanes % count:
        raise ValueError(f"a message of {lanes} lanes is not {count} equal chunks")
    first, whole = _first_row(first_row)
    rows = lanes if three else lanes // count
    if first is None and local.shape[0] != count * rows:
        raise ValueError(f"local must be the message's {count * rows} rows [rows, 128] (or "
                         f"name first_row=), got {list(local.shape)}")
    stride = rows if stride is None else stride
    t = _tile(rows, stride, *whole)
    return _call(functools.partial(_hop_body, fmt), fmt, t, count, rows, values=local,
                 messages=[message], result="message", interpret=interpret, first_row=first,
                 stride=stride, into=_check_message_into(into, fmt, count, rows),
                 stacked_result=stacked)


def reduce(messages, fmt: Format, *, interpret=None) -> Message:
    """Two-shot's reduce step: p messages `[p, G PB, r]` -> the message of their sum, decoded
    and added in rank order in f32; one pass, no f32 sum in HBM."""
    fmt = checked_format(fmt)
    messages = _message(messages, fmt, "messages")
    if messages.payload.ndim != 3:
        raise ValueError("reduce takes p messages stacked [p, G PB, rows]")
    rows = messages.payload.shape[-1]
    t = _tile(rows)
    return _call(functools.partial(_reduce_body, fmt), fmt, t, 1, rows, stack=messages,
                 result="message", interpret=interpret)


def _check_message_into(into, fmt: Format, count: int, rows: int):
    """`into` (`(message or chunks, chunk)`) checked: room for `count` chunks of `rows` rows
    from chunk `chunk`."""
    if into is None:
        return None
    target, chunk = into
    if isinstance(target, int):
        total = target
    else:
        target = _message(target, fmt, "into")
        total = target.payload.shape[0] if target.payload.ndim == 3 else \
            target.payload.shape[-1] // rows
        if target.payload.shape[-1] != (rows if target.payload.ndim == 3 else total * rows):
            raise ValueError(f"into must hold chunks of {rows} rows, got a message of "
                             f"{target.payload.shape[-1]} lanes")
    if chunk < 0 or chunk + count > total:
        raise ValueError(f"into lays {count} chunks from chunk {chunk}: past its {total}")
    return target, chunk
