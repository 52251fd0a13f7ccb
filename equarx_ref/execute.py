"""Executing a schedule: the steps of a `Schedule`, as shard_map collectives on messages.

`collectives.all_reduce` checks its arguments, picks the format (the size gate), the remedies and
the implementation, and hands the XLA path here. `run_schedule` walks the schedule:

- a reduce step of kind "permute" is one `lax.ppermute`: every device encodes the chunk the step
  names into one message (`wire.Message`: its payload and its scales, two lane-dense arrays
  that travel together), sends it, and the receiver decodes
  it to f32 and adds its own copy of that chunk. The next hop re-quantizes that partial sum.
- "all_to_all" (two-shot) sends every chunk to its owner, which decodes and sums the p copies
  in rank order; an "all_gather" in the reduce phase (one-shot) gathers whole inputs and every
  device sums them in rank order.
- the gather phase: each owner encodes its reduced chunks once; `lax.all_gather(...,
  to="invarying")` brings them to everyone; every device decodes the same bytes, so the owner
  keeps dequantize(quantize(sum)), bitwise what the others get.

`fmt=None` runs the same schedule unquantized: the partial sums travel in x's own dtype, bit for
bit (a bf16 input really sends 2 bytes per value; it is bitcast to bytes so XLA:CPU cannot widen
it), rounded to that dtype at each hop like a bf16 ring on real hardware.

A backend codec may fuse a hop (`kernels.mosaic_codec.MosaicCodec`, `impl="mosaic"`): then a permute
step keeps what it received as a pending sum (`_Sum`: the bytes plus the local chunk, named by
its rows in the array that holds it, `_Rows`, which the codec's kernels read where they lie
rather than from a slice XLA would write to memory first), and the step that sends exactly
that sum onwards hands both to the codec's `hop`, decode, add and encode in one pass, so the
f32 partial sum never goes to memory. Two-shot's all-to-all keeps
its p messages pending the same way, and the gather's encode of their sum is the codec's
`reduce`. Anything else that reads a pending sum computes it there, the same additions as the
XLA codec's path.

Layout (`schedule.layout`): the flattened input is zero-padded to the schedule's chunks, cut at
block boundaries. With `num_chunks=k` (ring family) each chunk is cut into k pieces and the
schedule runs on every piece: piece j's hop s depends only on piece j's hop s-1, so quantizing
piece j+1, sending piece j and accumulating piece j-1 are independent operations a compiler may
overlap (a software pipeline). Blocks never straddle pieces, so the result is bitwise that of
k = 1 and the bytes are the same. For a codec whose kernels read values as rows of 128
(`dense`), the chunks are held as `[chunks, L / 128, 128]`, the view a TPU keeps a flat array
in, so that no relayout of the input or of the result goes through HBM; everywhere else as
`[chunks, L]` (the same program as before that view existed, on XLA:CPU and on the XLA path).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from .quantize import rank_order_sum, zero_subnormals
from .schedule import HopPlan, Schedule, layout, make_schedule
from .wire import Codec, Message

__all__ = ["run_schedule", "typed_all_gather"]

# ---- what travels: one message, payload and scales, per send (`wire.Codec`) ----------------


class _Wire:
    """The codec and the rounding key of each step: one format everywhere, or a `HopPlan`;
    keys folded from the call's key by piece, step time and device (None: round to nearest)."""

    GATHER = 1 << 20  # the gather phase's "time" in the key

    def __init__(self, fmt, dtype, plan: HopPlan | None, key, me, mesh_axes=(), codec=Codec):
        self.plan, self.key, self.me, self.mesh_axes = plan, key, me, mesh_axes
        # a backend's codec codes each quantized message; raw bits go through `wire.Codec`
        self.default = codec(fmt, dtype) if fmt is not None else Codec(fmt, dtype)
        self.align = plan.align if plan is not None else self.default.align
        self.codecs = {} if plan is None else {
            t: Codec(f, dtype) for t, f in (*plan.reduce, (None, plan.gather))}
        self.piece = 0

    def codec(self, time: int | None) -> Codec:
        """The codec of reduce step `time`, or of the gather phase (None)."""
        return self.codecs.get(time, self.default)

    def rounding(self, time: int | None):
        if self.key is None:
            return None
        key = jax.random.fold_in(jax.random.fold_in(self.key, self.piece),
                                 self.GATHER if time is None else time)
        return jax.random.fold_in(key, self.me)


# ---- executing a schedule ------------------------------------------------------------------


def typed_all_gather(x, name: str, mesh_axes, **kw):
    """lax.all_gather of an array or a message, its result typed invariant over a mesh axis
    (`to=` exists only for mesh axes: under `vmap(axis_name=...)` or `pmap` it is left out)."""
    extra = {"to": "invarying"} if name in mesh_axes else {}
    return jax.tree.map(lambda a: lax.all_gather(a, name, **kw, **extra), x)


def _each(f, message):
    """`f` applied to each array of a message (payload, scales)."""
    return jax.tree.map(f, message)


def _table(values) -> jax.Array:
    return jnp.asarray(values, jnp.int32)


def _lanes(values: jax.Array, codec) -> jax.Array:
    """Decoded rows `[..., m]` as rows of 128 values, `[..., m / 128, 128]`, for a codec whose
    kernels write that view (`dense`): summed in it, the rows never take XLA:TPU's (8, 128)
    tiling across messages, a relayout in HBM."""
    m = values.shape[-1]
    return values.reshape(*values.shape[:-1], m // 128, 128) if codec.dense and m % 128 == 0 \
        else values


class _Rows:
    """Rows `start .. start + count` of a held array `[chunks, ...]` (`start` traced), of each
    only its columns `window` (`(first, columns)` of axis 1: a pipelined piece; None: all), not
    cut out yet: a codec that `places` them reads them where they lie (`MosaicCodec.encode_at`,
    `MosaicCodec.hop_at`); for any other, or where the rows are not on whole tiles, `cut`. XLA:TPU
    writes a slice that feeds a kernel to HBM first, a custom call cannot fuse it: on a ring a
    whole extra pass over the input, and cutting a pipeline's pieces out of the input another
    (`runs/tpu_bytes.py` counts them: data/tpu-bytes.json)."""

    def __init__(self, source: jax.Array, start, count: int, window=None):
        self.source, self.start, self.window = source, start, window
        cols = source.shape[1] if window is None else window[1]
        self.shape = (count, cols * math.prod(source.shape[2:]))

    def cut(self) -> jax.Array:
        rows = lax.dynamic_slice_in_dim(self.source, self.start, self.shape[0])
        if self.window is not None:
            rows = lax.slice_in_dim(rows, self.window[0], sum(self.window), axis=1)
        return rows.reshape(self.shape)

    def placed(self, codec) -> bool:
        """Whether `codec` reads these rows where they lie (`MosaicCodec.places`)."""
        return codec.places(self.source.shape, self.window, self.shape[0])

    def encode(self, codec) -> jax.Array:
        """`codec`'s message of these rows, `[count, ...]`: read in place where it `placed`
        them (`encode_at`), else cut out first."""
        if self.placed(codec):
            return codec.encode_at(self.source, self.start, self.shape[0], self.window)
        return codec.encode(self.cut())

    def hop(self, codec, message: Message, into=None) -> Message:
        """`codec.hop(message, these rows)`, `[count, ...]`: read in place where it `placed`
        them (`hop_at`, which writes into `into` where given), else cut out first."""
        if self.placed(codec):
            return codec.hop_at(message, self.source, self.start, self.shape[0], self.window,
                                into=into)
        if into is not None:
            raise ValueError("only a codec that reads the rows in place writes into a message")
        return codec.hop(message, self.cut())


def _cut(local):
    return local.cut() if isinstance(local, _Rows) else local


class _Sum:
    """A partial sum not computed yet, in f32: a ring hop's decode(message) + local (an array
    or `_Rows`), or, with no local, two-shot's p received messages `[p, ...]` decoded and
    added in rank order. The codec's fused step (`MosaicCodec.hop`, `MosaicCodec.reduce`) sends it
    onwards in one pass when the next step sends exactly it; anything else reads its values
    (`_Held.rows`)."""

    def __init__(self, message: Message, local: jax.Array | None, codec):
        self.message, self.local, self.codec = message, local, codec
        self.count = 1 if local is None else local.shape[0]  # chunks


class _Held:
    """Where each device's current value of each chunk lives, known when tracing.

    A chunk is either still the device's own input row (`x`, in its own dtype, converted to the
    accumulation dtype where it is read) or row j of the sums some step made. The schedules are
    the same on every device up to a rotation, so a step reads its chunks from the same source
    on every device, only at a device-dependent row (a table indexed by `me`): nothing is copied
    into a whole-message accumulator, and a hop's dequantize-add-quantize reads the received
    bytes and one input chunk and writes the next message.
    """

    def __init__(self, sched: Schedule, x: jax.Array, acc, me, quantized: bool, window=None):
        self.p, self.me, self.acc, self.quantized = sched.p, me, acc, quantized
        # source 0: the input rows [chunks, m], or [chunks, m / 128, 128] (`run_schedule`); of
        # a pipelined chunk the piece's columns `window` of axis 1, read where they lie
        # (`lazy`) or cut out
        self.input, self.window = x, window
        if window is not None:
            x = lax.slice_in_dim(x, window[0], sum(window), axis=1)
        self.sources: list[jax.Array] = [x]
        self.m = math.prod(x.shape[1:])
        self.where = [[(0, c) for c in range(sched.chunk_count)] for _ in range(self.p)]

    def rows(self, chunks_of) -> jax.Array:
        """This device's current values of the chunks `chunks_of(d)` names on device d."""
        return self.settle(self.raw(chunks_of).astype(self.acc))

    def raw(self, chunks_of) -> jax.Array:
        """`rows` as they are held: an input row in its own dtype, a sum in f32."""
        out = [_Rows(self.values(src), _table(first)[self.me], size).cut()
               for src, first, size in self._runs(chunks_of)]
        return out[0] if len(out) == 1 else jnp.concatenate(out)

    def lazy(self, chunks_of) -> _Rows | jax.Array:
        """`raw`, as `_Rows` of the array that holds them where that is one array already
        computed (the input, or a sum), else cut out."""
        runs = self._runs(chunks_of)
        if len(runs) == 1 and not isinstance(self.sources[runs[0][0]], _Sum):
            src, first, size = runs[0]
            if src == 0:  # the input, of a pipelined chunk the piece's columns
                return _Rows(self.input, _table(first)[self.me], size, self.window)
            return _Rows(self.sources[src], _table(first)[self.me], size)
        return self.raw(chunks_of)

    def _runs(self, chunks_of) -> list:
        """The chunks `chunks_of(d)` names, as runs of consecutive rows of one source, each
        `[source, [first row on device d for each d], rows]`."""
        wanted = [[self.where[d][c] for c in chunks_of(d)] for d in range(self.p)]
        parts = []
        for i in range(len(wanted[0])):  # runs of consecutive rows of one source
            src = wanted[0][i][0]
            if parts and parts[-1][0] == src and \
                    all(w[i] == (src, w[i - 1][1] + 1) for w in wanted):
                parts[-1][2] += 1
                continue
            if any(w[i][0] != src for w in wanted):
                raise ValueError("the schedule reads different sources on different devices")
            parts.append([src, [w[i][1] for w in wanted], 1])
        return parts

    def values(self, src: int) -> jax.Array:
        """Source `src`'s values, a pending sum computed here (once, then held)."""
        held = self.sources[src]
        if isinstance(held, _Sum) and held.local is None:  # computed where it is read, once
            got = _lanes(held.codec.decode(held.message, self.m), held.codec)
            held = self.sources[src] = rank_order_sum(got, self.settle)[None]
        elif isinstance(held, _Sum):
            count, m = held.local.shape
            got = held.codec.decode(held.message, count * m).reshape(count, m)
            held = self.sources[src] = got + self.settle(_cut(held.local).astype(self.acc))
        return held

    def send(self, chunks_of, codec, key, *, flat: bool = False) -> jax.Array:
        """The message of this device's chunks `chunks_of(d)` ([chunks, m] values, or flat):
        encoded, or, where they are exactly pending sums that `codec` fuses, one after another,
        each hop in one pass (`MosaicCodec.hop`): their f32 sums never leave the core. Several
        sums read in place go into one message, each hop writing its part (`hop_at(into=)`)."""
        wanted = [[self.where[d][c] for c in chunks_of(d)] for d in range(self.p)]
        sums = self._pending(wanted, codec) if key is None else None
        if sums and (len(sums) == 1 or not flat) and \
                all(codec.fuses(held.count * self.m if flat else self.m) for held in sums):
            if len(sums) == 1:
                return self._fused(sums[0], flat)
            if all(isinstance(held.local, _Rows) and held.local.placed(held.codec)
                   for held in sums):  # each hop writes its place in one message: no join
                out, i = sum(held.count for held in sums), 0
                for held in sums:
                    out, i = held.local.hop(held.codec, held.message, (out, i)), i + held.count
                return out
            return jax.tree.map(lambda *a: jnp.concatenate(a),
                                *[self._fused(held, flat) for held in sums])
        # the kernels take the values as they are held (their quantizer reads a subnormal
        # as a zero of its sign itself): no f32 copy of an input chunk
        if codec.reads_raw and key is None and codec.fuses(self.m):
            values = self.lazy(chunks_of)
            if isinstance(values, _Rows) and (values.shape[0] == 1 or not flat):
                message = values.encode(codec)
                return _each(lambda a: a[0], message) if flat else message
        values = self.raw(chunks_of) if codec.reads_raw else self.rows(chunks_of)
        return codec.encode(values.reshape(-1) if flat else values, key)

    def _fused(self, held: _Sum, flat: bool) -> jax.Array:
        """The message of a pending sum, by the codec's one-pass step."""
        if held.local is None:  # two-shot: p messages in, their sum's message out
            message = held.codec.reduce(held.message, self.m)
            return message if flat else _each(lambda a: a[None], message)
        if isinstance(held.local, _Rows) and held.codec.fuses(self.m):
            message = held.local.hop(held.codec, held.message)
            return held.codec.flatten(message) if flat else message
        local = _cut(held.local)
        return held.codec.hop(held.message, local.reshape(-1) if flat else local)

    def _pending(self, wanted, codec) -> list[_Sum] | None:
        """The pending sums of `codec` that `wanted` reads whole, one after another (on every
        device alike), or None."""
        sums, i = [], 0
        while i < len(wanted[0]):
            src = wanted[0][i][0]
            held = self.sources[src]
            if not isinstance(held, _Sum) or held.codec is not codec:
                return None
            whole = [(src, j) for j in range(held.count)]
            if any(w[i:i + len(whole)] != whole for w in wanted):
                return None
            sums.append(held)
            i += len(whole)
        return sums or None

    def settle(self, values: jax.Array) -> jax.Array:
        """A quantized schedule adds f32 values whose subnormals read as zeros of their sign
        (`zero_subnormals`): XLA:CPU and TPUs flush them, GPUs keep them, and an input of
        -1e-40 added to a received +0 would otherwise give +0 on one and -0 on the other.
        Kept as it is on every backend: it is one select beside the addition, which XLA:CPU
        fuses into it."""
        return zero_subnormals(values) if self.quantized and self.acc == jnp.float32 \
            else values

    def store(self, values, chunks_of) -> None:
        """`values` [k, m] (or a `_Sum` of them) are now device d's chunks `chunks_of(d)`."""
        self.sources.append(values)
        for d in range(self.p):
            for j, c in enumerate(chunks_of(d)):
                self.where[d][c] = (len(self.sources) - 1, j)


def _reduce_phase(sched: Schedule, held: _Held, wire: _Wire, axes) -> None:
    """Run the reduce steps: afterwards each owner holds its chunks' sums."""
    m = held.m
    everything = lambda d: range(sched.chunk_count)  # noqa: E731
    group = axes if len(axes) > 1 else axes[0]
    for step in (s for s in sched.steps if s.phase == "reduce"):
        codec, key = wire.codec(step.time), wire.rounding(step.time)
        if step.kind == "permute":  # one fused pass: decode what arrives, add, encode onwards
            by_src = {t.src: t.chunks for t in step.transfers}
            by_dst = {t.dst: t.chunks for t in step.transfers}
            count = len(step.transfers[0].chunks)
            buf = held.send(by_src.__getitem__, codec, key, flat=True)
            buf = lax.ppermute(buf, group, [(t.src, t.dst) for t in step.transfers])
            if codec.fuses(count * m):  # the sum stays lazy
                held.store(_Sum(buf, held.lazy(by_dst.__getitem__), codec), by_dst.__getitem__)
            else:
                got = codec.decode(buf, count * m).reshape(count, m)
                held.store(got + held.rows(by_dst.__getitem__), by_dst.__getitem__)
        elif step.kind == "all_to_all":  # two-shot: row c goes to device c, which sums them
            got = _each(lambda a: lax.all_to_all(a, group, 0, 0),
                        held.send(everything, codec, key))
            held.store(_Sum(got, None, codec), lambda d: (d,))  # pending: summed where read
        elif step.kind == "all_gather":  # one-shot: every input to everyone, summed everywhere
            got = typed_all_gather(held.send(everything, codec, key), axes[step.axis],
                                   wire.mesh_axes, axis=0)
            # the same sums on every device
            held.store(rank_order_sum(_lanes(codec.decode(got, m), codec), held.settle),
                       everything)
        else:
            raise ValueError(f"cannot execute a reduce step of kind {step.kind!r}")


def _gather_phase(sched: Schedule, held: _Held, wire: _Wire, axes, dtype,
                  into=None) -> jax.Array:
    """Owners encode their chunks once; all-gathers (in schedule order) bring them to all,
    decoded into `dtype` (the result's, unless a remedy still works on the sums): one pass
    from the bytes to the result, no f32 copy of the whole message in between. With `into`
    (`(out, window)`, where the codec `places` it), each chunk is decoded over its columns
    `window` of `out` (the whole result, or its shape) and that is returned."""
    p, m = sched.p, held.m
    owned = [[c for c, own in enumerate(sched.owners) if d in own] for d in range(p)]
    k = len(owned[0])
    codec = wire.codec(None)
    buf = held.send(owned.__getitem__, codec, wire.rounding(None))  # [k, *message]
    dims = _each(lambda a: a.ndim - 1, buf)  # each array's dimensions of one message
    for step in (s for s in sched.steps if s.phase == "gather"):
        buf = typed_all_gather(buf, axes[step.axis], wire.mesh_axes, axis=0, tiled=False)
    # each array of buf is now [..., k, *message] with one leading axis per gather, outermost
    # = last one, which is row-major device order: [p * k, *message], chunk owned[d][j] at
    # message d * k + j, decoded in chunk order (the Mosaic codec reads each where it lies)
    buf = jax.tree.map(lambda a, d: a.reshape(p * k, *a.shape[a.ndim - d:]), buf, dims)
    chunks = [c for d in range(p) for c in owned[d]]  # the chunk of each gathered message
    order = sorted(range(p * k), key=chunks.__getitem__)  # the message of each chunk
    order = None if order == list(range(p * k)) else order  # None: already in chunk order
    if into is not None:
        return codec.decode_into(buf, *into, dtype, order)
    if order is None:
        return codec.decode(buf, m, dtype)
    return codec.decode_in_order(buf, m, dtype, order)


@functools.partial(jax.jit, static_argnums=(2, 3, 4, 5, 6, 7, 8, 9, 10))
def run_schedule(x, key, axes, shape, fmt, algorithm, num_chunks, rotation, plan, mesh_axes,
                 codec=Codec):
    """Execute the schedule. What the caller chose above the core comes in as arguments: the
    `rotation` (None, or a pair of functions `(values, block) -> values`, applied once before
    the first hop and once after the last), the hop `plan` (None: `fmt` on every step) and the
    `codec` class that codes each quantized message (`wire.Codec`, or a backend's).

    Jitted on its own so that a `shard_map` run without an outer `jax.jit` compiles once
    instead of dispatching every small operation eagerly; inside `jit` it is inlined."""
    n = x.size
    sched = make_schedule(algorithm, shape)
    me = lax.axis_index(axes if len(axes) > 1 else axes[0])
    wire = _Wire(fmt, x.dtype, plan, key, me, mesh_axes, codec)
    rotate = rotation is not None
    length, pieces = layout(n, sched.chunk_count, wire.align, num_chunks)
    flat = x.reshape(-1)  # stays in x's dtype: each chunk is converted where a hop reads it
    if sched.chunk_count * length > n:
        flat = jnp.pad(flat, (0, sched.chunk_count * length - n))
    if rotate:  # once, at the input: the schedule then sums rotated blocks
        flat = rotation[0](flat, fmt.block_size)
    chunks, unit = flat.reshape(sched.chunk_count, length), 1  # [chunks, L]
    if wire.default.dense and all(v % 128 == 0 for piece in pieces for v in piece):
        # rows of 128 values, the view a TPU holds a flat array in, whose tiles the Mosaic
        # codec's kernels read as they are (kernels/codec.py `_dense`); [chunks, L] would be
        # tiled across chunks: a relayout of the whole input in HBM
        chunks, unit = flat.reshape(sched.chunk_count, length // 128, 128), 128
    gathers = any(step.phase == "gather" for step in sched.steps)
    windows = [None] if len(pieces) == 1 else [(a // unit, m // unit) for a, m in pieces]
    # a codec that decodes each piece where it lies in the result: no concatenation after
    # (on XLA:TPU a pass over the whole result)
    out = jax.ShapeDtypeStruct(chunks.shape, x.dtype) if len(pieces) > 1 and gathers and \
        not rotate and all(wire.codec(None).places(chunks.shape, w) for w in windows) else None
    parts = []
    for j, window in enumerate(windows):  # independent: the compiler may overlap hops
        wire.piece = j
        held = _Held(sched, chunks, wire.default.acc, me, fmt is not None, window)
        _reduce_phase(sched, held, wire, axes)
        if out is not None:
            out = _gather_phase(sched, held, wire, axes, x.dtype, (out, window))
            continue
        part = _gather_phase(sched, held, wire, axes, wire.default.acc if rotate else
                             x.dtype) if gathers else held.values(-1)
        parts.append(part if unit == 1 else part.reshape(part.shape[0], -1, unit))
    if out is None:  # as `chunks`
        out = jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    if rotate:  # once, at the end, on the same decoded values on every device
        out = rotation[1](out.reshape(-1), fmt.block_size)
    return out.reshape(-1)[:n].reshape(x.shape).astype(x.dtype)
