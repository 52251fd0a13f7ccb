"""The collectives' codec on the Mosaic kernels: what `all_reduce(..., impl="mosaic")` codes with.

The executor (execute.py) speaks `wire.Codec`'s language: values `[..., m]`, a message per
chunk (`[count, ...]`) or one message for several chunks side by side, and a hop is a decode,
an add and an encode. `MosaicCodec` speaks it on the kernels of codec.py, so the same messages
travel (wire.py's layout is theirs), and adds what only kernels can do:

- it fuses: `hop(message, local)` is one kernel pass, `encode(decode(message) + local)` with
  the f32 sum kept on chip, and `reduce` is two-shot's reduce step in one pass; the executor
  keeps a sum pending (`execute._Sum`) until one of them sends it;
- it works in place: `encode_at` and `hop_at` read a held chunk (or, of a pipelined chunk,
  its window of rows) where it lies in the array that holds it, and `decode_into` writes a
  piece's values straight into their place in the result; `hop_at(into=)` writes a hop's
  message into its place in a larger one. XLA:TPU writes a slice that feeds a custom call to
  HBM first, and joins pieces with a pass of its own: each of these saves a pass.

A message the kernels do not take (`codec.takes`: too short, or not whole tiles of rows) goes
through `wire.Codec`, the same bytes. Off a TPU (`interpret=None`) the kernels' tile code runs
as XLA operations on whole messages (`tiles.py`): TPU interpret mode runs a kernel on every
device of a mesh in step, through a barrier, and inside an 8-device `shard_map` on a 2-core
CPU that deadlocks once XLA:CPU's threads all wait there. `interpret=True` asks for interpret
mode anyway (the tests run the kernels that way). Round to nearest only; `rules.py` refuses
stochastic rounding with `impl="mosaic"`.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from ..formats import Format
from ..wire import Codec, Message
from . import backend, codec, tiles

__all__ = ["MosaicCodec"]


def _rows(v: jax.Array) -> jax.Array:
    """Values `[..., m]` as rows of 128 `[..., m / 128, 128]`."""
    return v.reshape(*v.shape[:-1], v.shape[-1] // 128, 128)


def _each(f, *messages):
    return jax.tree.map(f, *messages)


class MosaicCodec(Codec):
    """The Mosaic codec as the collectives' codec (`execute.py`, `impl="mosaic"`): `wire.Codec`'s
    interface, and the fused and in-place steps the module essay describes."""

    def __init__(self, fmt: Format, dtype, interpret=None):
        super().__init__(fmt, dtype)
        self.interpret = interpret
        # off a TPU (interpret=None): the tile code as XLA ops on whole messages
        self.xla_ops = interpret is None and backend.interpret_params() is not False

    @staticmethod
    def supports(fmt) -> bool:
        """Whether the kernels code `fmt` (`tiles.supports`: 8-bit and 4-bit elements, blocks
        that divide 128 into whole registers)."""
        return tiles.supports(fmt)

    #: `encode` takes a flat message in the input's own dtype: a kernel reads bf16 from HBM,
    #: half an f32 copy's bytes (`execute.py`).
    reads_raw = True
    #: The executor holds the input as rows of 128 values, the view the kernels read.
    dense = True

    def fuses(self, m: int) -> bool:
        """Whether the kernels code messages of `m` values (and `hop`, `reduce` run as one
        pass)."""
        return self.acc == jnp.float32 and codec.takes(self.fmt, m)

    # ---- whole messages ----------------------------------------------------------------------

    def encode(self, v: jax.Array, key=None) -> Message:
        """Values `[..., m]` -> their message (a stack over the leading axes)."""
        if key is not None:
            raise ValueError("the Mosaic codec rounds to nearest: stochastic rounding (key=) "
                             "needs impl='xla'")
        m = v.shape[-1]
        if not self.fuses(m):
            return super().encode(v)
        lead = v.shape[:-1]
        rows = _rows(v.reshape(-1, m))  # [count, r, 128]
        if self.xla_ops:
            out = jax.vmap(lambda x: tiles.encode(x, self.fmt))(rows)
        else:
            out = codec.encode(rows.reshape(-1, 128), self.fmt, count=rows.shape[0],
                               stacked=True, interpret=self.interpret)
        return _each(lambda a: a.reshape(*lead, *a.shape[1:]), out)

    def decode(self, message: Message, m: int, dtype=None) -> jax.Array:
        """A message of `m` values (or a stack of them) -> values `[..., m]`."""
        dtype = jnp.dtype(dtype or self.acc)
        if not self.fuses(m):
            return super().decode(message, m, dtype)
        lead = message.payload.shape[:-2]
        stack = _each(lambda a: a.reshape(-1, *a.shape[-2:]), message)
        if self.xla_ops:
            out = jax.vmap(lambda x: tiles.decode(x, self.fmt, dtype))(stack)
        else:
            out = codec.decode(stack, self.fmt, dtype, interpret=self.interpret)
        return out.reshape(*lead, m)

    def decode_in_order(self, message: Message, m: int, dtype, order) -> jax.Array:
        """Messages `[count, ...]` of `m` values each, decoded in `order` (a static
        permutation): `decode(message[order])`, `[count, m]`, each message read where it
        lies."""
        if not self.fuses(m) or self.xla_ops:
            return super().decode_in_order(message, m, dtype, order)
        out = codec.decode(message, self.fmt, jnp.dtype(dtype or self.acc), order=order,
                           interpret=self.interpret)
        return out.reshape(len(order), m)

    def hop(self, message: Message, local: jax.Array) -> Message:
        """The next message: `encode(decode(message) + local)`, the sum in f32 with a subnormal
        local value read as a zero of its sign; `local` `[..., m]` in its own dtype, `message`
        its message (one, or a stack over local's leading axes)."""
        m = local.shape[-1]
        if not self.fuses(m):
            raise ValueError(f"the Mosaic codec's hop does not take messages of {m} values")
        lead = local.shape[:-1]
        rows = _rows(local.reshape(-1, m))
        stack = _each(lambda a: a.reshape(rows.shape[0], *a.shape[-2:]), message)
        if self.xla_ops:
            out = jax.vmap(lambda w, x: tiles.hop(w, x, self.fmt))(stack, rows)
        else:
            out = codec.hop(stack, rows.reshape(-1, 128), self.fmt, stacked=True,
                            interpret=self.interpret)
        return _each(lambda a: a.reshape(*lead, *a.shape[1:]), out)

    def reduce(self, message: Message, m: int) -> Message:
        """Two-shot's reduce step in one pass: p messages `[p, ...]` of `m` values -> the
        message of their sum, added in rank order in f32."""
        if not self.fuses(m):
            raise ValueError(f"the Mosaic codec's reduce does not take messages of {m} values")
        if self.xla_ops:
            return tiles.reduce([_each(lambda a, r=r: a[r], message)
                                 for r in range(message.payload.shape[0])], self.fmt)
        return codec.reduce(message, self.fmt, interpret=self.interpret)

    # ---- in place -------------------------------------------------------------------------

    def _place(self, shape, count: int, window) -> tuple[int, int, int] | None:
        """(m, rows a chunk holds, the window's first row): chunks `[chunks, R, 128]` of an
        array of `shape`, of each its rows `window` (`(first, rows)`; None: all), m values a
        chunk's window; None where the kernels cannot read them where they lie (not rows of
        128, no kernel tiles for the window, or offsets off the tiles)."""
        if self.xla_ops or len(shape) != 3 or shape[2] != 128:
            return None
        first, rows = (0, shape[1]) if window is None else window
        m = rows * 128
        t = codec.tile_rows(rows)
        if not self.fuses(m) or t is None or shape[1] % t or first % t:
            return None
        return m, shape[1], first

    def places(self, shape, window, count: int = 1) -> bool:
        """Whether the kernels read (`encode_at`, `hop_at`) or write (`decode_into`) `count`
        chunks' rows `window` of an array of `shape` `[chunks, R, 128]` where they lie; where
        not, the executor cuts them out (`execute._Rows.cut`) and codes the slice."""
        return self._place(shape, count, window) is not None

    def _placed(self, shape, count: int, window) -> tuple[int, int, int]:
        place = self._place(shape, count, window)
        if place is None:
            raise ValueError(f"the Mosaic codec cannot code {count} chunk(s) of an array "
                             f"{tuple(shape)} (rows {window}) where they lie: cut them out "
                             "first (`places` says which)")
        return place

    def encode_at(self, source: jax.Array, start, count: int, window=None) -> Message:
        """`encode(source[start:start + count])` (of each chunk only its rows `window` where
        given; `start` traced), a stack `[count, ...]`, read where the rows lie."""
        m, r, o = self._placed(source.shape, count, window)
        return codec.encode(source.reshape(-1, 128), self.fmt, rows=m // 128, count=count,
                            first_row=(start, r, o), stride=r, stacked=True,
                            interpret=self.interpret)

    def hop_at(self, message: Message, source: jax.Array, start, count: int, window=None,
               into=None) -> Message:
        """`hop(message, source[start:start + count])` (of each chunk its rows `window`),
        a stack `[count, ...]`, with the rows read where they lie. `message` is the chunks'
        message, one of their lanes side by side or a stack. With `into` (`(out, i)`: a
        stack, or a count of chunks for a new one whose others are unset), the result is
        written over out's messages i .. i + count, in place, and out returned."""
        _, r, o = self._placed(source.shape, count, window)
        flat = message.payload.ndim == 2
        return codec.hop(message, source.reshape(-1, 128), self.fmt,
                         count=count if flat else None, first_row=(start, r, o), stride=r,
                         stacked=True, into=into, interpret=self.interpret)

    def decode_into(self, message: Message, out, window, dtype, order=None) -> jax.Array:
        """Messages `[chunks, ...]` decoded (in `order`: message `order[i]` for chunk i),
        each written over its chunk's rows `window` of `out`: an array `[chunks, R, 128]`, in
        place, or a `jax.ShapeDtypeStruct` for a new one, whose other rows are then unset (a
        pipeline's later pieces fill them). Needs `places(out.shape, window)`."""
        _, r, o = self._placed(out.shape, 1, window)
        target = out.reshape(-1, 128) if isinstance(out, jax.Array) else \
            math.prod(out.shape[:2])
        got = codec.decode(message, self.fmt, jnp.dtype(dtype), order=order,
                           into=(target, r, o), interpret=self.interpret)
        return got.reshape(out.shape)
