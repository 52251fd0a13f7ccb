"""Quantized AllReduce: the schedules of schedule.py, executed with shard_map collectives.

`all_reduce(x, axis_name, ...)` goes inside `jax.shard_map` exactly where `lax.psum(x, axis_name)`
would, and returns a result that is identical on every device and typed as such (usable with
`out_specs=P()` under `check_vma=True`). It walks a `Schedule`:

- a reduce step of kind "permute" is one `lax.ppermute`: every device encodes the chunk the step
  names into one uint8 buffer (payload and scales together), sends it, and the receiver decodes
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

Layout. The flattened input is zero-padded to `C` chunks of `L` values, L a multiple of the block
size, where C is the schedule's chunk count; so padding and chunk ownership depend only on the
length, the devices and the block. With `num_chunks=k` (ring family) each chunk is cut at block
boundaries into k pieces and the schedule runs on every piece: piece j's hop s depends only on
piece j's hop s-1, so quantizing piece j+1, sending piece j and accumulating piece j-1 are
independent operations the compiler may overlap (a software pipeline). Blocks never straddle
pieces, so the result is bitwise that of k = 1 and the bytes are the same.

Error model. Quantizing a sum of k independent N(0, s^2) inputs costs an error of variance
k * c^2 s^2, where c = `quantize.gaussian_relative_error(fmt)` (about 0.54% for int8 with a
bf16 scale per 32; 9.9% for int4). Errors of different quantizations are independent, so a value's
final error variance is c^2 s^2 times the sum of the sizes k of every partial sum it went through
quantized, and relative to the exact sum (variance p s^2):

    ring         hops carry 1, 2, ..., p-1 inputs, the owner's final chunk p:  c sqrt((p+1)/2)
    bidir_ring   the same per half:                                            c sqrt((p+1)/2)
    2D torus     1..p1-1 along axis 0, then p1 * (1..p2-1), then p1 p2:        (see sizes)
    two_shot     p inputs once, the owner's sum once:                          c sqrt(2)
    one_shot     p inputs once:                                                c

For int8 at p = 8 that is 1.15% (ring), 0.77% (two-shot) and 0.54% (one-shot):
`predicted_relative_error` computes it and the tests hold the measured error to it.
"""

from __future__ import annotations

import itertools
import math
import operator
import re

import jax
import jax.numpy as jnp
from jax import lax

from .formats import Format
from .quantize import decode, encode, gaussian_relative_error, wire_nbytes
from .schedule import Schedule, make_schedule

__all__ = [
    "ALGORITHMS",
    "all_reduce",
    "hlo_wire_bytes",
    "predicted_relative_error",
    "quantized_sizes",
    "wire_bytes",
]

ALGORITHMS = ("psum", "ring", "bidir_ring", "two_shot", "one_shot")
_RING_FAMILY = ("ring", "bidir_ring")


# ---- what travels: one uint8 buffer per message ----------------------------------------------


class _Codec:
    """Values <-> wire bytes: block-quantized with `fmt`, or raw bits of `dtype` if fmt is None."""

    def __init__(self, fmt: Format | None, dtype):
        self.fmt = fmt
        self.dtype = jnp.dtype(dtype)
        self.acc = jnp.promote_types(self.dtype, jnp.float32)  # accumulate in f32 (or f64)
        self.align = fmt.block_size if fmt is not None else 1

    def encode(self, v: jax.Array) -> jax.Array:  # [..., m] -> uint8 [..., bytes]
        if self.fmt is not None:
            return encode(v, self.fmt)
        raw = lax.bitcast_convert_type(v.astype(self.dtype), jnp.uint8)
        return raw.reshape(*v.shape[:-1], -1)

    def decode(self, buf: jax.Array, m: int) -> jax.Array:  # uint8 [..., bytes] -> acc [..., m]
        if self.fmt is not None:
            return decode(buf, self.fmt, m).astype(self.acc)
        if self.dtype.itemsize > 1:
            buf = buf.reshape(*buf.shape[:-1], m, self.dtype.itemsize)
        return lax.bitcast_convert_type(buf, self.dtype).astype(self.acc)

    def nbytes(self, m: int) -> int:
        return wire_nbytes(m, self.fmt, self.dtype)


def _layout(n: int, sched: Schedule, align: int, num_chunks: int) -> tuple[int, list[tuple]]:
    """Chunk length L (a multiple of `align`) and the pipeline pieces [(start, length)]."""
    units = max(1, -(-n // (sched.num_chunks * align)))  # aligned units per chunk
    k = min(num_chunks, units)  # never more pieces than blocks
    bounds = [units * j // k for j in range(k + 1)]
    pieces = [(a * align, (b - a) * align) for a, b in itertools.pairwise(bounds)]
    return units * align, pieces


# ---- executing a schedule ------------------------------------------------------------------


def _table(values) -> jax.Array:
    return jnp.asarray(values, jnp.int32)


def _rank_order_sum(parts: jax.Array) -> jax.Array:
    """parts[0] + parts[1] + ... in rank order: the same additions on every device."""
    total = parts[0]
    for r in range(1, parts.shape[0]):
        total = total + parts[r]
    return total


def _reduce_phase(sched: Schedule, acc: jax.Array, codec: _Codec, axes, me) -> jax.Array:
    """Run the reduce steps on acc [chunks, m]: afterwards each owner holds its chunks' sums."""
    p, m = sched.p, acc.shape[1]
    group = axes if len(axes) > 1 else axes[0]
    for step in (s for s in sched.steps if s.phase == "reduce"):
        if step.kind == "permute":
            by_src = {t.src: t for t in step.transfers}
            by_dst = {t.dst: t for t in step.transfers}
            count = len(step.transfers[0].chunks)
            send = _table([by_src[d].chunks[0] for d in range(p)])[me]
            recv = _table([by_dst[d].chunks[0] for d in range(p)])[me]
            wire = codec.encode(lax.dynamic_slice_in_dim(acc, send, count).reshape(-1))
            wire = lax.ppermute(wire, group, [(t.src, t.dst) for t in step.transfers])
            got = codec.decode(wire, count * m).reshape(count, m)
            mine = lax.dynamic_slice_in_dim(acc, recv, count)
            acc = lax.dynamic_update_slice_in_dim(acc, got + mine, recv, axis=0)
        elif step.kind == "all_to_all":  # two-shot: row c goes to device c
            got = codec.decode(lax.all_to_all(codec.encode(acc), group, 0, 0), m)
            acc = lax.dynamic_update_slice_in_dim(acc, _rank_order_sum(got)[None], me, axis=0)
        elif step.kind == "all_gather":  # one-shot: every input to everyone, summed everywhere
            got = lax.all_gather(codec.encode(acc), axes[step.axis], axis=0, to="invarying")
            acc = _rank_order_sum(codec.decode(got, m))  # [chunks, m]: the same on every device
        else:
            raise ValueError(f"cannot execute a reduce step of kind {step.kind!r}")
    return acc


def _gather_phase(sched: Schedule, acc: jax.Array, codec: _Codec, axes, me) -> jax.Array:
    """Owners encode their chunks once; all-gathers (in schedule order) bring them to all."""
    p, m = sched.p, acc.shape[1]
    owned = [[c for c, own in enumerate(sched.owners) if d in own] for d in range(p)]
    wire = codec.encode(jnp.take(acc, _table(owned)[me], axis=0))  # [k, bytes]
    for step in (s for s in sched.steps if s.phase == "gather"):
        wire = lax.all_gather(wire, axes[step.axis], axis=0, tiled=False, to="invarying")
    # wire is now [..., k, bytes] with one leading axis per gather, outermost = last one,
    # which is row-major device order: flatten to [p * k, bytes].
    values = codec.decode(wire.reshape(p * len(owned[0]), -1), m)
    order = [c for d in range(p) for c in owned[d]]
    return jnp.take(values, _table(sorted(range(len(order)), key=order.__getitem__)), axis=0)


# ---- the public collective -----------------------------------------------------------------


def _axes(axis_name) -> tuple[str, ...]:
    """The axis, or the pair of axes in mesh order (ppermute numbers devices in mesh order)."""
    axes = (axis_name,) if isinstance(axis_name, str) else tuple(axis_name)
    if not axes or len(axes) > 2 or not all(isinstance(a, str) for a in axes) or \
            len(set(axes)) != len(axes):
        raise ValueError(f"axis_name must be a mesh axis name or a pair of distinct ones, "
                         f"got {axis_name!r}")
    names = tuple(jax.sharding.get_abstract_mesh().axis_names)
    for a in axes:
        try:
            lax.axis_size(a)
        except (NameError, KeyError, ValueError):
            raise ValueError(f"unknown mesh axis {a!r}; all_reduce runs inside jax.shard_map "
                             f"over one of the mesh axes {names}") from None
    return tuple(sorted(axes, key=names.index)) if set(axes) <= set(names) else axes


def _check(x, fmt, algorithm, num_chunks) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format or None, got {type(fmt).__name__}")
    if algorithm == "psum" and fmt is not None:
        raise ValueError("algorithm='psum' is the built-in lax.psum and sends x unquantized: "
                         "pass fmt=None (or pick 'ring', 'bidir_ring', 'two_shot', 'one_shot')")
    if not isinstance(num_chunks, int) or isinstance(num_chunks, bool) or num_chunks < 1:
        raise ValueError(f"num_chunks must be a positive integer, got {num_chunks!r}")
    if num_chunks > 1 and algorithm not in _RING_FAMILY:
        raise ValueError(f"num_chunks (pipelining) applies to {_RING_FAMILY}, not {algorithm!r}")
    dtype = jnp.result_type(x)
    if not jnp.issubdtype(dtype, jnp.floating):
        raise TypeError(f"all_reduce needs a floating-point array, got dtype {dtype}; "
                        "quantized sums of integers are not defined here (cast to float first)")


def all_reduce(x: jax.Array, axis_name, *, fmt: Format | None = Format.int8(),  # noqa: B008
               algorithm: str = "ring", num_chunks: int = 1) -> jax.Array:
    """Sum `x` over the devices of `axis_name`, sending quantized data. Use inside `shard_map`.

    Args:
        x: this device's float array (any shape); every device passes the same shape.
        axis_name: a mesh axis, or a pair of axes (2D torus; "ring" and "bidir_ring" only).
        fmt: the wire format (default int8, block 32, bf16 scale); None sends x's dtype as is.
        algorithm: "ring", "bidir_ring", "two_shot", "one_shot", or "psum" (lax.psum, fmt=None).
        num_chunks: pipeline depth for the ring family; the result does not depend on it.

    Returns:
        The sum, with the shape and dtype of `x`: bitwise identical on every device and typed
            invariant over `axis_name`, so `out_specs=P()` works under `check_vma=True`.

    Raises:
        TypeError: `x` is not floating point, or `fmt` is not a Format.
        ValueError: unknown algorithm or axis, `fmt` given with "psum", bad `num_chunks`.
    """
    _check(x, fmt, algorithm, num_chunks)
    if algorithm == "psum":
        return lax.psum(x, axis_name)
    axes = _axes(axis_name)
    sched = make_schedule(algorithm, tuple(lax.axis_size(a) for a in axes))
    codec = _Codec(fmt, x.dtype)
    n = math.prod(x.shape)
    length, pieces = _layout(n, sched, codec.align, num_chunks)
    flat = jnp.pad(x.reshape(-1).astype(codec.acc), (0, sched.num_chunks * length - n))
    chunks = flat.reshape(sched.num_chunks, length)  # [chunks, L]
    me = lax.axis_index(axes if len(axes) > 1 else axes[0])
    gathers = any(step.phase == "gather" for step in sched.steps)
    parts = []
    for start, size in pieces:  # independent pieces: the compiler may overlap their hops
        piece = _reduce_phase(sched, chunks[:, start:start + size], codec, axes, me)
        parts.append(_gather_phase(sched, piece, codec, axes, me) if gathers else piece)
    out = jnp.concatenate(parts, axis=1) if len(parts) > 1 else parts[0]
    return out.reshape(-1)[:n].reshape(x.shape).astype(x.dtype)


# ---- bytes and error, predicted ------------------------------------------------------------


def wire_bytes(n: int, p, *, fmt: Format | None, algorithm: str, dtype="bfloat16",
               num_chunks: int = 1) -> int:
    """Bytes one device sends for an AllReduce of `n` values over `p` devices.

    Counted from the schedule `all_reduce` executes: every transfer of a device, encoded chunk
    sizes included (payload plus scales, after padding). `p` may be a pair (2D torus).
    "psum" is modelled as a ring, 2 (p - 1) / p * n values of `dtype` (XLA:CPU widens a bf16
    psum to f32 in practice; on TPU it sends bf16).
    """
    _check(jnp.zeros((), dtype), fmt, algorithm, num_chunks)
    shape = _device_shape(p)
    if operator.index(n) < 0:
        raise ValueError(f"n must be a non-negative number of values, got {n}")
    if algorithm == "psum":
        total = math.prod(shape)
        return 2 * (total - 1) * n * jnp.dtype(dtype).itemsize // total
    sched = make_schedule(algorithm, shape)
    codec = _Codec(fmt, dtype)
    _, pieces = _layout(n, sched, codec.align, num_chunks)
    per_chunk = sum(codec.nbytes(size) for _, size in pieces)
    return sched.chunks_sent(0) * per_chunk


def _device_shape(p) -> tuple[int, ...]:
    """`p` devices, or a (p1, p2) torus, as a shape of positive integers."""
    shape = tuple(p) if isinstance(p, (tuple, list)) else (p,)
    shape = tuple(operator.index(q) for q in shape)
    if not 1 <= len(shape) <= 2 or min(shape) < 1:
        raise ValueError(f"p must be a positive device count or a pair of them, got {p!r}")
    return shape


def quantized_sizes(algorithm: str, p) -> list[int]:
    """Sizes (inputs summed) of every quantized partial sum one output value went through."""
    shape = _device_shape(p)
    total = math.prod(shape)
    if algorithm in _RING_FAMILY:
        sizes, done = [], 1
        for q in shape:  # a ring along each axis in turn
            sizes += [done * k for k in range(1, q)]
            done *= q
        return [*sizes, total]
    if algorithm == "two_shot":
        return [1] * total + [total]
    if algorithm == "one_shot":
        return [1] * total
    raise ValueError(f"no quantization in {algorithm!r}; choose one of {ALGORITHMS[1:]}")


def predicted_relative_error(fmt: Format | None, algorithm: str, p) -> float:
    """Expected ||all_reduce - exact|| / ||exact|| for i.i.d. Gaussian inputs (module essay).

    0.0 for `fmt=None` or "psum" (exact up to the rounding of the accumulation dtype).
    """
    if fmt is None or algorithm == "psum":
        return 0.0
    total = math.prod(_device_shape(p))
    c = gaussian_relative_error(fmt)
    return c * math.sqrt(sum(quantized_sizes(algorithm, p)) / total)


# ---- bytes, read back from the compiled program ----------------------------------------------

_HLO_OP = re.compile(r"=\s*(\(.*?\)|\S+)\s+(collective-permute|all-to-all|all-gather|all-reduce)"
                     r"(-start)?\(")
_HLO_SHAPE = re.compile(r"(pred|[a-z]+\d*(?:e\d+m\d+\w*)?)\[([\d,]*)\]")
_HLO_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s4": 1, "u4": 1, "bf16": 2, "f16": 2, "s16": 2,
              "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}


def _group_size(line: str, default: int) -> int:
    m = re.search(r"replica_groups=\{\{([\d,]+)\}", line)
    if m:
        return len(m.group(1).split(","))
    m = re.search(r"replica_groups=\[(\d+),(\d+)\]", line)
    return int(m.group(2)) if m else default


def hlo_wire_bytes(hlo_text: str, p: int) -> dict[str, float]:
    """Bytes one device sends, read from compiled HLO text, by collective kind.

    collective-permute: its operand; all-to-all: (g-1)/g of it; all-gather: (g-1) shards of
    its result; all-reduce: 2 (g-1)/g of its operand (a ring model). g: the replica group size
    (`p` if the op names none). Element bytes come from the HLO types (f8 = 1, bf16 = 2...).
    Asynchronous forms (`*-start`, as on TPU and GPU) return a tuple (operands, results,
    scalar contexts): the operand half counts for collective-permute, the result half for
    all-gather. A collective inside a loop body is counted once, not once per trip.
    """
    out: dict[str, float] = {}
    for line in hlo_text.splitlines():
        m = _HLO_OP.search(line)
        if not m:
            continue
        shapes, kind = m.group(1), m.group(2)
        found = _HLO_SHAPE.findall(shapes)
        if m.group(3) and shapes.startswith("(") and kind != "all-reduce":
            found = [(dt, dims) for dt, dims in found if dims]  # drop scalar contexts
            half = len(found) // 2  # (operands..., results...)
            found = found[half:] if kind == "all-gather" else found[:half]
        sizes = [_HLO_BYTES.get(dt, 1 if dt.startswith("f8") else 4)
                 * math.prod(int(d) for d in dims.split(",") if d) for dt, dims in found]
        size = sum(sizes)
        g = _group_size(line, p)
        sent = {"collective-permute": size, "all-to-all": size * (g - 1) / g,
                "all-gather": size * (g - 1) / g, "all-reduce": 2 * size * (g - 1) / g}[kind]
        out[kind] = out.get(kind, 0.0) + sent
    return out
