"""The quantized ring AllReduce as one Pallas TPU kernel: remote DMAs, semaphores, a pipeline.

`collectives.all_reduce(..., impl="xla")` hands every hop to XLA as a `ppermute` and leaves the
overlap to the compiler. Here the whole AllReduce (reduce-scatter, then all-gather) is one
`pallas_call`, written the way EQuARX runs inside XLA:TPU: each device streams messages to its
neighbour with remote DMAs and does the dequantize-add-quantize of one piece while the next
piece is on the wire.

Memory spaces. A TPU core computes on VMEM (tens of MiB of on-chip vector memory); HBM is large
and only reachable by DMA. The input `x` and the result live in HBM (`pl.ANY`, the kernel must
not load them directly: the interpreter refuses it as the chip would); each piece of `x` is
copied into a VMEM slot by a local DMA (`make_async_copy`) one step ahead of its use, and each
decoded result piece is copied back out. The wire buffers (send and receive slots, uint8) are
VMEM scratch; semaphores live in their own memory (`SemaphoreType.DMA`, `.REGULAR`).

Remote DMA and semaphores. `make_async_remote_copy(src, dst, send_sem, recv_sem, device_id)`
copies a local VMEM slot into a slot of the neighbour's VMEM. `start()` returns at once; the
sender's `wait_send()` returns when the source may be overwritten, the receiver's `wait_recv()`
when the bytes have landed. Nothing else orders two devices, so three rules keep the ring
race-free:
- a barrier at entry (`get_barrier_semaphore`): nobody DMAs into a neighbour that has not
  entered the kernel;
- read a receive slot only after `wait_recv()` on its semaphore;
- write into a neighbour's slot only after the neighbour said it is free: after reading a slot
  the receiver signals a REGULAR "capacity" semaphore on the sender (`pl.semaphore_signal(...,
  device_id=upstream)`), and the sender waits on it before reusing that slot.
Drop the last rule (`sabotage="capacity"`) and the sender may overwrite a message the receiver
has not read yet; the interpreter's race detector (`InterpretParams(detect_races=True)`, a
vector-clock happens-before check) reports it, which the tests and `kernels.check` show.

The pipeline. Each chunk is cut into `k = num_chunks` pieces at block boundaries (the same
`schedule.layout` as the XLA path, so the same blocks, the same bytes). Message (h, j) is hop h
of piece j; a device handles them in the order t = h k + j:

    wait recv (h-1, j)   ->  decode + add local piece (f32)  ->  encode  ->  start send (h, j)
                              (meanwhile (h-1, j+1) is still arriving)

so the DMA of piece j+1 overlaps the fused compute of piece j. A received message is consumed
k steps after it was sent, so the receive side has k + 1 slots (k = 1: the classic double
buffer); fewer would deadlock the ring, every device waiting for its downstream neighbour's
capacity. Hops 0..p-2 reduce (the sum grows by one device per hop); at hop p-1 the owner of a
chunk encodes the full sum once, decodes its own copy, and sends the bytes on; hops p..2p-2
forward those bytes unchanged (the all-gather) while every device decodes them. So the owner
keeps exactly dequantize(quantize(sum)), bitwise what the others get, as on the XLA path.
"bidir_ring" runs two such lanes at once, chunks 0..p-1 clockwise and p..2p-1 counter-clockwise,
each with its own slots and semaphores.

Numerics: every piece is coded inside the kernel by the tile code (tiles.py, the Mosaic
codec's own, bitwise the spec), so every message is bitwise the XLA path's message and the
result is bitwise `impl="xla"`'s. The formats are the tile code's: 8-bit and 4-bit elements in
blocks that divide 128. Any other (six-bit MX, odd widths such as int7, larger blocks) is
refused before anything is traced (`plan_ring`), naming impl='pallas'; impl="xla" runs them.

Layout for Mosaic. A TPU vector memory is tiled: the last two dimensions of a buffer are cut
into tiles (8 x 128 for f32, 32 x 128 for bytes...), and a DMA may slice them only at tile
boundaries. So no buffer is ever sliced along its last two dimensions: every piece of a chunk
lives in a row of its own, `[lanes, slot, 1, piece]`, the slot axis off the tiled pair, and the
input and result are handed to the kernel as `[chunks, pieces, 1, piece]` (a copy made by XLA
outside the kernel). The layout cuts a chunk into pieces of at most two lengths (whole blocks,
as evenly as it can), and each length gets buffers of its own, so every DMA moves whole rows,
whatever the length: 96 values, 4096, odd block counts, and pieces shorter than one 128-lane
tile row (32 values of int8, 37 of bf16: VMEM pads the row, the DMA moves the piece), so no
length needs a fallback. Compiled with libtpu from a CPU machine (`runs/tpu_matrix.py`, the
compile tier of tests/run.sh), the ring and the bidirectional ring build for the chips,
formats, device counts and pipeline depths its record lists (equarx_ref/data/tpu.json; v5p and
v4: docs/data/tpu-v5p-v4.json). Compiled is not run: no TPU run or timing of this kernel is
claimed; interpret mode proves it bitwise and race-free.

Limits, stated plainly. The steps are unrolled when tracing ((2p - 1) k per lane), so the
program grows with p and k: fine for a slice's ring of 4-16 chips, not for hundreds. VMEM holds
only slots (a few pieces), never a whole chunk, but a piece must fit in VMEM: choose num_chunks
so that a piece is at most a few MiB.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from .._checks import array
from ..formats import Format
from ..wire import Codec, Message
from . import backend, tiles
from .plan import RingPlan, plan_ring

__all__ = ["SABOTAGES", "ring_all_reduce"]

#: Deliberately broken variants, for showing the race detector at work: "capacity" skips the
#: sender's wait for the receiver's "slot free" signal (it still balances the semaphore at exit);
#: "early_read" reads every receive slot before waiting for its message, a race on every
#: message whatever the threads' timing (what the tests use: a red test is a real defect).
SABOTAGES = ("capacity", "early_read")

_UINT = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}


class _Pieces:
    """How one piece of a chunk lives in the kernel's memory and travels: a quantized piece as
    rows of 128 values and its message's two arrays (payload `[G PB, rows]`, scales
    `[G, rows]`, wire.py), coded by the tile code (tiles.py); an unquantized one as one row of
    values `[1, size]` and their raw bits, the same shape."""

    def __init__(self, fmt: Format | None, dtype):
        self.fmt, self.dtype = fmt, jnp.dtype(dtype)
        self.acc = Codec(fmt, dtype).acc

    def values(self, size: int) -> tuple[int, int]:
        return (size // 128, 128) if self.fmt is not None else (1, size)

    def parts(self, size: int) -> list[tuple[tuple[int, int], object]]:
        """(shape, dtype) of each array of a piece's message."""
        if self.fmt is None:
            return [((1, size), _UINT[self.dtype.itemsize])]
        rows, f = size // 128, self.fmt
        bits = {"bfloat16": jnp.uint16, "float32": jnp.uint32, "e8m0": jnp.uint8}
        return [((f.blocks_per_row * f.payload_bytes_per_block, rows), jnp.uint8),
                ((f.blocks_per_row, rows), bits[f.scale_dtype])]

    def encode(self, v) -> list:
        if self.fmt is None:
            return [lax.bitcast_convert_type(v.astype(self.dtype), _UINT[self.dtype.itemsize])]
        return list(tiles.encode(v, self.fmt))

    def decode(self, parts) -> jax.Array:
        if self.fmt is None:
            return lax.bitcast_convert_type(parts[0], self.dtype).astype(self.acc)
        return tiles.decode(Message(*parts), self.fmt)

    def hop(self, parts, v) -> list:
        if self.fmt is None:
            return self.encode(self.decode(parts) + v.astype(self.acc))
        return list(tiles.hop(Message(*parts), v, self.fmt, flushes=True))


def _kernel(plan: RingPlan, codec: _Pieces, axis: str, sabotage: str | None, me_ref, *refs):
    p, k, slots = plan.p, plan.k, plan.slots
    classes, nparts = len(plan.sizes), 1 if codec.fmt is None else 2
    # refs: x, out, local, res (one per size class each), recv, send (one per size class and
    # message part each), then the semaphores
    x_ref, out_ref, local, res = (refs[i * classes:(i + 1) * classes] for i in range(4))
    at = 4 * classes
    recv = [refs[at + c * nparts:at + (c + 1) * nparts] for c in range(classes)]
    at += classes * nparts
    send = [refs[at + c * nparts:at + (c + 1) * nparts] for c in range(classes)]
    at += classes * nparts
    local_sem, recv_sem, send_sem, out_sem, capacity = refs[at:]
    me = me_ref[0]  # this device's index on the ring (an SMEM scalar, see _call)
    right, left = lax.rem(me + 1, p), lax.rem(me + p - 1, p)

    # Entry barrier: both neighbours are inside the kernel before anyone DMAs into them.
    barrier = pltpu.get_barrier_semaphore()
    for nb in (left, right):
        pl.semaphore_signal(barrier, 1, device_id={axis: nb})
    pl.semaphore_wait(barrier, 2)

    def chunk(lane, h):  # the chunk this device sends at reduce hop h (h = p - 1: its own)
        base, way = plan.lanes[lane]
        return base + lax.rem(me - way * (h + 1) + 2 * p * p, p)

    def out_row(lane, h):  # the chunk whose reduced bytes this device holds at hop h >= p - 1
        base, way = plan.lanes[lane]
        return base + lax.rem(me - way * (h - p + 1) + 2 * p * p, p)

    # Every buffer holds whole pieces of one size class (c, i = plan.slot_of[j]): DMAs copy
    # whole pieces, never a slice of the last (tiled) dimensions, which Mosaic could not align.
    def fetch(lane, t):  # local DMA: piece of x needed at step t, HBM -> VMEM slot t % 2
        h, j = divmod(t, k)
        c, i = plan.slot_of[j]
        return pltpu.make_async_copy(x_ref[c].at[chunk(lane, h), i], local[c].at[lane, t % 2],
                                     local_sem.at[lane, t % 2])

    def message(lane, t):  # remote DMAs: message t's arrays, my send slot -> downstream's
        _, way = plan.lanes[lane]
        c, _ = plan.slot_of[t % k]
        return [pltpu.make_async_remote_copy(
            send[c][q].at[lane, t % 2], recv[c][q].at[lane, t % slots],
            send_sem.at[lane, t % 2, q], recv_sem.at[lane, t % slots, q],
            device_id={axis: right if way > 0 else left})  # {mesh axis: index}: a mesh id
            for q in range(nparts)]

    def store(lane, t):  # local DMA: decoded result piece, VMEM slot t % 2 -> HBM
        h, j = divmod(t, k)
        c, i = plan.slot_of[j]
        return pltpu.make_async_copy(res[c].at[lane, t % 2], out_ref[c].at[out_row(lane, h), i],
                                     out_sem.at[lane, t % 2])

    first_store = (p - 1) * k
    for lane in range(len(plan.lanes)):
        fetch(lane, 0).start()
    for t in range(plan.steps):
        h, j = divmod(t, k)
        c = plan.slot_of[j][0]
        for lane in range(len(plan.lanes)):
            _, way = plan.lanes[lane]
            upstream = left if way > 0 else right
            if t + 1 < p * k:
                fetch(lane, t + 1).start()  # prefetch: overlaps this step's compute
            if h <= p - 1:
                fetch(lane, t).wait()
                mine = local[c][lane, t % 2]
            if h >= 1:  # message t - k: the same piece, one hop earlier
                if sabotage == "early_read":  # the slot read before its bytes have landed
                    got = [r[lane, (t - k) % slots] for r in recv[c]]
                    for dma in message(lane, t - k):
                        dma.wait_recv()
                else:
                    for dma in message(lane, t - k):
                        dma.wait_recv()
                    got = [r[lane, (t - k) % slots] for r in recv[c]]
                if t - k + slots < plan.messages:  # the slot is free: tell upstream
                    pl.semaphore_signal(capacity.at[lane], 1, device_id={axis: upstream})
            # The fused hop: what this device sends (or keeps) at hop h.
            if h == 0:
                wire = codec.encode(mine)
            elif h <= p - 1:
                wire = codec.hop(got, mine)
            else:
                wire = got  # the all-gather forwards the owner's bytes unchanged
            if h >= p - 1:  # reduced bytes: decode into the result (the owner too)
                if t - 2 >= first_store:
                    store(lane, t - 2).wait()
                res[c][lane, t % 2] = codec.decode(wire).astype(res[c].dtype)
                store(lane, t).start()
            if t < plan.messages:
                if t >= 2:
                    for dma in message(lane, t - 2):
                        dma.wait_send()
                for q in range(nparts):
                    send[c][q][lane, t % 2] = wire[q]
                if t >= slots and sabotage != "capacity":
                    pl.semaphore_wait(capacity.at[lane], 1)
                for dma in message(lane, t):
                    dma.start()
    for lane in range(len(plan.lanes)):  # drain: every DMA and signal accounted for
        for t in range(max(plan.messages - 2, 0), plan.messages):
            for dma in message(lane, t):
                dma.wait_send()
        for t in range(max(plan.steps - 2, first_store), plan.steps):
            store(lane, t).wait()
        if sabotage == "capacity":  # the skipped waits, taken at the end: counts balance
            pl.semaphore_wait(capacity.at[lane], max(plan.messages - slots, 0))


def _call(plan: RingPlan, codec: _Pieces, axis: str, interpret, sabotage,
          pieces: list[jax.Array], varying: frozenset):
    """The pallas_call, on the pieces of x grouped by size class (`[chunks, count, *piece]`
    each). The device index comes in as an SMEM scalar rather than from `lax.axis_index`
    inside the kernel: interpret mode re-traces the body inside the caller's shard_map, where
    (jax 0.10.2, check_vma=True) arithmetic on the kernel's axis_index fails the varying-axes
    check; a value read from memory is typed like any other."""
    me = lax.axis_index(axis).astype(jnp.int32).reshape(1)
    lanes, slots = len(plan.lanes), plan.slots
    sizes = plan.sizes
    nparts = len(codec.parts(sizes[0]))
    dtype = pieces[0].dtype
    kernel = functools.partial(_kernel, plan, codec, axis, sabotage)
    # [lanes, slot, *piece]: the slot axis stays off the last two (tiled) dimensions
    scratch = [*(pltpu.VMEM((lanes, 2, *codec.values(m)), dtype) for m in sizes),  # local
               *(pltpu.VMEM((lanes, 2, *codec.values(m)), codec.acc) for m in sizes),  # res
               *(pltpu.VMEM((lanes, slots, *shape), d)  # recv: k + 1 slots
                 for m in sizes for shape, d in codec.parts(m)),
               *(pltpu.VMEM((lanes, 2, *shape), d)  # send: in flight
                 for m in sizes for shape, d in codec.parts(m)),
               pltpu.SemaphoreType.DMA((lanes, 2)),
               pltpu.SemaphoreType.DMA((lanes, slots, nparts)),
               pltpu.SemaphoreType.DMA((lanes, 2, nparts)),
               pltpu.SemaphoreType.DMA((lanes, 2)),
               pltpu.SemaphoreType.REGULAR((lanes,))]  # capacity: free slots downstream
    any_space = pl.BlockSpec(memory_space=pl.ANY)
    return pl.pallas_call(
        kernel,
        out_shape=[backend.result_type(a.shape, codec.acc, varying) for a in pieces],
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), *(any_space for _ in pieces)],
        out_specs=[any_space for _ in pieces],
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret,
    )(me, *pieces)


def ring_all_reduce(x: jax.Array, axis_name: str, *, fmt: Format | None = Format.int8(),  # noqa: B008
                    algorithm: str = "ring", num_chunks: int = 1, interpret=None,
                    sabotage: str | None = None) -> jax.Array:
    """Sum `x` over `axis_name` with the Pallas ring kernel. Use inside `jax.shard_map`.

    `eq.all_reduce(x, axis_name, impl="pallas", ...)` calls this after its checks (size gate,
    one device, empty input); called directly it runs the kernel whatever the size.

    Args:
        x: this device's float array; every device passes the same shape.
        axis_name: one mesh axis (the ring).
        fmt: the wire format (one the tile code takes: `tiles.supports`), or None for x's
            own dtype bit for bit.
        algorithm: "ring" or "bidir_ring".
        num_chunks: pieces per chunk in the kernel's pipeline (k; k + 1 receive slots).
        interpret: None picks the backend (native on a TPU, else TPU interpret mode with the
            race detector on); or pass True/False or a `pltpu.InterpretParams`.
        sabotage: None, or a name from `SABOTAGES`: a deliberately racy kernel.

    Returns:
        The sum, shape and dtype of `x`, bitwise `all_reduce(..., impl="xla")`'s.
    """
    if sabotage is not None and sabotage not in SABOTAGES:
        raise ValueError(f"sabotage must be None or one of {SABOTAGES}, got {sabotage!r}")
    if not isinstance(axis_name, str) or not axis_name:
        raise ValueError(f"axis_name must name one mesh axis (the Pallas kernel's ring), got "
                         f"{axis_name!r} (a 2D torus runs with impl='xla')")
    x = array(x, "x", floating=True)
    try:
        p = lax.axis_size(axis_name)
    except NameError:
        raise ValueError(f"axis_name {axis_name!r} is not a mesh axis here (call "
                         "ring_all_reduce inside shard_map over it)") from None
    interpret = backend.interpret_params(interpret)
    plan_ring(x.size, p, fmt=fmt, algorithm=algorithm,
              num_chunks=num_chunks, dtype=x.dtype)  # checks the arguments
    return _ring(x, axis_name, fmt, algorithm, num_chunks, interpret, sabotage)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6))
def _ring(x, axis_name, fmt, algorithm, num_chunks, interpret, sabotage):
    """Lay out, run the kernel, cut the padding. Jitted on its own, as collectives' `_run`, so
    an eager shard_map compiles it once; the result is typed the same on every device of the
    ring (varying only over the other mesh axes x varies over)."""
    p, n = lax.axis_size(axis_name), x.size
    plan = plan_ring(n, p, fmt=fmt, algorithm=algorithm, num_chunks=num_chunks, dtype=x.dtype)
    codec = _Pieces(fmt, x.dtype)
    flat = x.reshape(-1)
    if plan.chunks * plan.length > n:
        flat = jnp.pad(flat, (0, plan.chunks * plan.length - n))
    chunks = flat.reshape(plan.chunks, plan.length)
    by_size = [[j for j, (_, size) in enumerate(plan.pieces) if size == m] for m in plan.sizes]
    pieces = [jnp.stack([chunks[:, plan.pieces[j][0]:sum(plan.pieces[j])].reshape(
        plan.chunks, *codec.values(plan.pieces[j][1])) for j in group], axis=1)
        for group in by_size]  # [chunks, count, *piece]
    outs = _call(plan, codec, axis_name, interpret, sabotage, pieces,
                 backend.varying(x) - {axis_name})
    out = jnp.concatenate([outs[c][:, i].reshape(plan.chunks, -1) for c, i in plan.slot_of],
                          axis=1)
    return out.reshape(-1)[:n].reshape(x.shape).astype(x.dtype)
