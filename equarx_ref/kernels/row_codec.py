"""The collectives' codec on the Mosaic kernels: what `all_reduce(..., impl="mosaic")` codes with.

`codec.py` codes one message of rows; the executor (`execute.py`) speaks `wire.Codec`'s
language: a message is `[..., bytes]`, values are `[..., m]`, and a hop is a decode, an add and
an encode. `RowCodec` is the adapter between the two, and `message_rows` its one decision: how
a message of `m` values is cut into rows the kernels take (rows of 128 blocks, whole tiles of 8
rows, when m allows; else 8 shorter rows; else none, and the XLA codec carries that message).
Rows laid end to end are the flat message, so the wire bytes do not depend on the cut.

Two things make it more than a renaming. It fuses: `hop(message, local)` is one kernel pass,
`encode(decode(message) + local)` with the f32 sum kept in VMEM, and `reduce` is two-shot's
reduce step in one pass; the executor keeps a sum pending (`execute._Sum`) until one of them
sends it. And it works in place: `encode_at` and `hop_at` take the whole held input, a traced
first row and, for a piece of a pipelined chunk, its window of columns, where a slice would be
written to HBM before a custom call could read it; `decode_into` writes a piece's values
straight into their place in the result, where XLA would join the pieces after. Either copy is
a pass over the whole array on XLA:TPU: cut and joined, the pipelined int8 ring came to 5.0x
psum's bytes at 16 MiB per chip, in place to 3.0x, as one message at a time (libtpu 0.0.42.1,
v5e). Likewise `hop_at(into=...)` writes a hop's message into its place in a larger one: a
bidirectional ring's gather sends both lanes' last sums as one message, which XLA joined after
(the bidirectional int8 ring at 16 MiB per chip: 102.9 MB accessed joined, 100.6 MB laid in
place).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..formats import Format
from ..wire import Codec
from . import backend
from .codec import (
    TILE_BLOCKS,
    TILE_ROWS,
    checked_format,
    decode,
    encode,
    hop,
    hop_tile,
    reduce,
    reduce_tile,
)
from .hop import wire_codec

__all__ = ["RowCodec", "message_rows"]


def message_rows(m: int, fmt: Format) -> int | None:
    """How the collectives lay a message of `m` values out for the kernels: rows of 128 blocks
    (whole tiles, 8 rows at a time) when m is a multiple of 8 x 128 blocks, else 8 rows of at
    most 128 blocks; None when neither fits (the XLA codec then carries that message: the same
    bytes, since rows laid end to end are the flat message)."""
    if m % fmt.block_size:
        return None
    blocks = m // fmt.block_size
    if blocks % (TILE_ROWS * TILE_BLOCKS) == 0:
        return blocks // TILE_BLOCKS
    if blocks % TILE_ROWS == 0 and blocks <= TILE_ROWS * TILE_BLOCKS:
        return TILE_ROWS
    return None


class RowCodec:
    """The Mosaic codec as the collectives' codec (`execute.py`, `impl="mosaic"`).

    It has `wire.Codec`'s interface (`encode`, `decode`, `acc`, `align`) and one more step,
    `hop(message, local)`: the next message, `encode(decode(message) + local)`, in one kernel
    pass, so the executor never writes a hop's f32 sum to HBM. A message of values `[..., m]`
    is `[..., R, bytes]`: R rows (`message_rows`) whose bytes, laid end to end, are
    `wire.encode`'s, so the same bytes travel as on the XLA path and a message the kernels do
    not take (`message_rows` None) goes through `wire.Codec` unchanged. Round to nearest only
    (the kernels have no stochastic rounding); `rules.py` refuses the rest.

    Off a TPU (`interpret=None`) the messages are coded by the kernels' own body
    (`wire_codec`, the Mosaic form of the codec) as XLA ops on whole messages, the same bytes:
    TPU interpret mode runs a kernel on every device of a mesh in step, through a barrier,
    and inside an 8-device `shard_map` on a 2-core CPU it deadlocks once XLA:CPU's threads are
    all waiting there (jax 0.10.2). `interpret=True` asks for interpret mode anyway.
    """

    def __init__(self, fmt: Format, dtype, interpret=None):
        self.xla = Codec(checked_format(fmt), dtype)
        self.fmt, self.acc, self.align = fmt, self.xla.acc, self.xla.align
        self.interpret = interpret
        # off a TPU (interpret=None): the kernels' body as XLA ops on whole messages
        self.body = None if interpret is not None or backend.interpret_params() is False \
            else wire_codec(fmt, dtype)

    def _rows(self, m: int) -> int | None:
        return message_rows(m, self.fmt) if self.acc == jnp.float32 else None

    def _encode(self, v):
        return self.body.encode(v) if self.body else encode(v, self.fmt,
                                                            interpret=self.interpret)

    def _decode(self, w, cols, dtype):
        if self.body:
            return wire_codec(self.fmt, jnp.float32).decode(w, cols, dtype)
        return decode(w, self.fmt, cols, dtype, interpret=self.interpret)

    def _hop(self, w, local):
        if self.body:
            return hop_tile(wire_codec(self.fmt, local.dtype), local.shape[-1], w, local)
        return hop(w, local, self.fmt, interpret=self.interpret)

    def encode(self, v: jax.Array, key=None) -> jax.Array:
        """values `[..., m]` -> uint8 `[..., R, bytes]` (`[..., bytes]` where R is None)."""
        if key is not None:
            raise ValueError("the Mosaic codec rounds to nearest: stochastic rounding (key=) "
                             "needs impl='xla'")
        m, rows = v.shape[-1], self._rows(v.shape[-1])
        if rows is None:
            return self.xla.encode(v)
        w = self._encode(v.reshape(-1, m // rows))
        return w.reshape(*v.shape[:-1], rows, w.shape[-1])

    def decode(self, buf: jax.Array, m: int, dtype=None) -> jax.Array:
        """uint8 `[..., R, bytes]` or `[..., bytes]` of `m` values a message -> `[..., m]`."""
        rows = self._rows(m)
        if rows is None:
            return self.xla.decode(buf, m, dtype)
        width = self.fmt.nbytes(m // rows)
        lead = buf.shape[:-2] if buf.shape[-2:] == (rows, width) else buf.shape[:-1]
        v = self._decode(buf.reshape(-1, width), m // rows, dtype or self.acc)
        return v.reshape(*lead, m)

    def decode_in_order(self, buf: jax.Array, m: int, dtype, order) -> jax.Array:
        """Messages `buf` `[count, ...]` of `m` values each, decoded in `order` (a static
        permutation): `decode(buf[order])`, `[count, m]`, each message read where it lies."""
        rows = self._rows(m)
        if rows is None or self.body:
            return self.xla.decode_in_order(buf, m, dtype, order) if rows is None else \
                self.decode(buf[jnp.asarray(order)], m, dtype)
        width = self.fmt.nbytes(m // rows)
        v = decode(buf.reshape(-1, width), self.fmt, m // rows, dtype or self.acc, order=order,
                   interpret=self.interpret)
        return v.reshape(len(order), m)

    #: `encode` takes a flat message in the input's own dtype: a kernel reads bf16 from HBM,
    #: half an f32 copy's bytes (`execute.py`).
    reads_raw = True
    #: The executor holds the input as rows of 128 values, the view the kernels read without a
    #: relayout (`_dense`).
    dense = True

    def fuses(self, m: int) -> bool:
        """Whether `hop` runs as one kernel on messages of `m` values."""
        return self._rows(m) is not None

    def _in_place(self, shape, count: int, window) -> tuple[int, tuple | None]:
        """(m, place): a message is `count` chunks of an array of `shape` `[chunks, ...]`, of
        each its columns `window` (`(first, columns)` of axis 1; None: all), m values a chunk.
        `place` is `(rows, r, o)`: the message's rows of `m / rows` values, chunk c's first at
        row c * r + o of the array taken as such rows, so the kernels read (or write) them where
        they lie; None where they cannot: no rows for m, a chunk or the window not on whole
        tiles of rows, or several chunks whose windows are not one run of rows."""
        unit = math.prod(shape[2:])
        first, cols = (0, shape[1]) if window is None else window
        m = cols * unit
        rows = self._rows(m)
        if rows is None or self.body:
            return m, None
        width = m // rows
        whole, offset = shape[1] * unit, first * unit
        if whole % width or offset % width:
            return m, None
        r, o = whole // width, offset // width
        if r % TILE_ROWS or o % TILE_ROWS or (count > 1 and r != rows):
            return m, None
        return m, (rows, r, o)

    def _placed(self, shape, count: int, window) -> tuple[int, tuple]:
        """`_in_place`, refused where the kernels cannot read the chunks where they lie."""
        m, place = self._in_place(shape, count, window)
        if place is None:
            raise ValueError(f"the Mosaic codec cannot code {count} chunk(s) of an array "
                             f"{tuple(shape)} (columns {window}) where they lie: cut them out "
                             "first (`places` says which)")
        return m, place

    def encode_at(self, source: jax.Array, start, count: int, window=None) -> jax.Array:
        """`encode(source[start:start + count])` (chunks of `m` values each, `start` traced; of
        each only its columns `window` where given), `[count, R, bytes]`, the rows read where
        they lie (as `hop_at`). Needs `places(source.shape, window, count)`."""
        m, (rows, r, o) = self._placed(source.shape, count, window)
        w = encode(source.reshape(-1, m // rows), self.fmt, rows=count * rows,
                   first_row=(start, r, o), interpret=self.interpret)
        return w.reshape(count, rows, w.shape[-1])

    def hop_at(self, buf: jax.Array, source: jax.Array, start, count: int,
               window=None, into=None) -> jax.Array:
        """`hop(buf, source[start:start + count])` (chunks of `m` values each, `start` traced;
        of each only its columns `window` where given: a piece of a pipelined chunk),
        `[count, R, bytes]`, with the rows read where they lie in `source`: XLA:TPU writes a
        slice that feeds a kernel to HBM first (a custom call cannot fuse it), a whole extra
        pass over a ring's input. Needs `places(source.shape, window, count)`.

        With `into` (`(out, i)`: out messages `[chunks, R, bytes]`, or a count of chunks for a
        new buffer whose other messages are then unset), the message is written over out's
        messages i .. i + count, in place, and out returned: a step that sends several pending
        sums (a bidirectional ring's gather) writes each where it goes in the one message,
        where XLA would join them after, a pass over the message on XLA:TPU."""
        m, (rows, r, o) = self._placed(source.shape, count, window)
        width = self.fmt.nbytes(m // rows)
        laid = None
        if into is not None:
            out, i = into
            laid = (out * rows if isinstance(out, int) else out.reshape(-1, width),
                    count * rows, count * rows, i * rows)
        w = hop(buf.reshape(-1, width), source.reshape(-1, m // rows), self.fmt,
                first_row=(start, r, o), into=laid, interpret=self.interpret)
        return w.reshape(-1, rows, width)

    def places(self, shape, window, count: int = 1) -> bool:
        """Whether the kernels read (`encode_at`, `hop_at`) or write (`decode_into`) `count`
        chunks' columns `window` of an array of `shape` `[chunks, ...]` where they lie; where
        not, the executor cuts them out (`execute._Rows.cut`) and codes the slice."""
        return self._in_place(shape, count, window)[1] is not None

    def decode_into(self, buf: jax.Array, out, window, dtype, order=None) -> jax.Array:
        """Messages `buf` `[chunks, ...]` decoded (in `order`: message `order[i]` for chunk i),
        each written over its chunk's columns `window` of `out`: an array `[chunks, ...]`, in
        place, or a `jax.ShapeDtypeStruct` for a new one, whose other columns are then unset
        (a pipeline's later pieces fill them). Needs `places(out.shape, window)`."""
        m, (rows, r, o) = self._placed(out.shape, 1, window)
        target = out.reshape(-1, m // rows) if isinstance(out, jax.Array) else \
            out.shape[0] * r
        v = decode(buf.reshape(-1, self.fmt.nbytes(m // rows)), self.fmt, m // rows, dtype,
                   order=order, into=(target, rows, r, o), interpret=self.interpret)
        return v.reshape(out.shape)

    def reduce(self, buf: jax.Array, m: int) -> jax.Array:
        """Two-shot's reduce step in one pass: p messages `[p, ...]` of `m` values -> the
        message of their sum, added in rank order in f32 (`reduce`), `[R, bytes]`. Needs
        `fuses(m)`."""
        rows = self._rows(m)
        if rows is None:
            raise ValueError(f"the Mosaic codec's reduce does not take messages of {m} values")
        w = buf.reshape(buf.shape[0], -1, self.fmt.nbytes(m // rows))
        if self.body:
            return reduce_tile(wire_codec(self.fmt, jnp.float32), m // rows, list(w))
        return reduce(w, self.fmt, m // rows, interpret=self.interpret)

    def hop(self, buf: jax.Array, local: jax.Array) -> jax.Array:
        """The next message: `encode(decode(buf) + local)`, the sum in f32 with a subnormal
        local value read as a zero of its sign; `local` `[..., m]` in its own dtype, `buf` its
        message (any shape of the same bytes). Needs `fuses(m)`."""
        m = local.shape[-1]
        rows = self._rows(m)
        if rows is None:
            raise ValueError(f"the Mosaic codec's hop does not take messages of {m} values")
        w = self._hop(buf.reshape(-1, self.fmt.nbytes(m // rows)), local.reshape(-1, m // rows))
        return w.reshape(*local.shape[:-1], rows, w.shape[-1])
