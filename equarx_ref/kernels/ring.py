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

Numerics: the fused hop calls the package's `quantize.encode` and `decode` on the values inside
the kernel (see hop.py), so every message is bitwise the XLA path's message and the result is
bitwise `impl="xla"`'s.

Limits, stated plainly. The steps are unrolled when tracing ((2p - 1) k per lane), so the
program grows with p and k: fine for a slice's ring of 4-16 chips, not for hundreds. VMEM holds
only slots (a few pieces), never a whole chunk. Natively, the kernel compiles only where its
codec lowers to Mosaic: the MX formats do; bf16/f32-scaled formats and fmt=None do not yet
(byte packing by bitcasts of different widths, see hop.py), so on a TPU those raise Mosaic's
error; everything is proven here in interpret mode, no TPU run of this kernel is claimed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from ..formats import Format
from ..schedule import RING_FAMILY, layout, make_schedule
from . import backend
from .hop import wire_codec

__all__ = ["SABOTAGES", "RingPlan", "plan_ring", "ring_all_reduce"]

#: Deliberately broken variants, for showing the race detector at work: "capacity" skips the
#: sender's wait for the receiver's "slot free" signal (it still balances the semaphore at exit).
SABOTAGES = ("capacity",)


@dataclasses.dataclass(frozen=True)
class RingPlan:
    """Everything static about one kernel: sizes, pieces, lanes, slots (known when tracing).

    Attributes:
        p: devices on the ring.
        n: values per device (before padding).
        chunks: chunks of the layout (p for "ring", 2p for "bidir_ring").
        length: values per chunk (padded, a multiple of the block).
        pieces: `(start, size)` of the pipeline pieces inside a chunk.
        piece_bytes: wire bytes of each piece.
        lanes: `(first chunk, direction)` per ring: (0, +1) sends right; (p, -1) sends left.
        slots: receive slots per lane, k + 1.
    """

    p: int
    n: int
    chunks: int
    length: int
    pieces: tuple[tuple[int, int], ...]
    piece_bytes: tuple[int, ...]
    lanes: tuple[tuple[int, int], ...]
    slots: int

    @property
    def k(self) -> int:
        return len(self.pieces)

    @property
    def steps(self) -> int:
        """Steps of one lane: 2p - 1 hops (the last only decodes) times k pieces."""
        return (2 * self.p - 1) * self.k

    @property
    def messages(self) -> int:
        """Messages one lane of one device sends: 2 (p - 1) hops times k pieces."""
        return 2 * (self.p - 1) * self.k

    @property
    def bytes_sent(self) -> int:
        """Wire bytes one device sends in total (all lanes, all hops)."""
        return len(self.lanes) * 2 * (self.p - 1) * sum(self.piece_bytes)

    def program(self, device: int = 0, lane: int = 0) -> list[dict]:
        """The kernel's steps on one device and lane, in order: what it waits for, computes
        and sends (plain data, for tables and timeline figures; the kernel runs exactly this).

        Each step: `step` t, `hop` h, `piece` j, `phase` ("reduce", "own": the owner's
        encode of the full sum, "gather", "last": decode only), `chunk` (sent or stored),
        `wait` (the message awaited, (hop, piece), or None), `recv_slot`, `compute`,
        `send_slot` (None when nothing is sent), `prefetch` (the step whose x piece is fetched).
        """
        p, k = self.p, self.k
        base, way = self.lanes[lane]
        rows = []
        for t in range(self.steps):
            h, j = divmod(t, k)
            phase = ("reduce" if h < p - 1 else "own" if h == p - 1 else
                     "gather" if h < 2 * p - 2 else "last")
            if h <= p - 1:
                chunk = base + (device - way * (h + 1)) % p
            else:
                chunk = base + (device - way * (h - p + 1)) % p
            compute = {"reduce": "encode(x)" if h == 0 else "encode(decode(in) + x)",
                       "own": "encode(decode(in) + x), decode", "gather": "forward, decode",
                       "last": "decode"}[phase]
            rows.append({"step": t, "hop": h, "piece": j, "phase": phase, "chunk": chunk,
                         "wait": (h - 1, j) if h >= 1 else None,
                         "recv_slot": (t - k) % self.slots if h >= 1 else None,
                         "compute": compute,
                         "send_slot": t % 2 if t < self.messages else None,
                         "prefetch": t + 1 if t + 1 < p * k else None})
        return rows


def plan_ring(n: int, p: int, *, fmt: Format | None, algorithm: str = "ring",
              num_chunks: int = 1, dtype="float32") -> RingPlan:
    """The static plan of the kernel for `n` values per device on a ring of `p` devices."""
    if algorithm not in RING_FAMILY:
        raise ValueError(f"the Pallas kernel runs algorithm 'ring' or 'bidir_ring', got "
                         f"{algorithm!r} (use impl='xla' for the others)")
    sched = make_schedule(algorithm, (p,))
    codec = wire_codec(fmt, dtype)
    length, pieces = layout(n, sched.chunk_count, codec.align, num_chunks)
    lanes = ((0, +1),) if algorithm == "ring" else ((0, +1), (p, -1))
    return RingPlan(p, n, sched.chunk_count, length, pieces,
                    tuple(codec.nbytes(size) for _, size in pieces), lanes, len(pieces) + 1)


def _kernel(plan: RingPlan, codec, axis: str, sabotage: str | None,
            me_ref, x_ref, out_ref, local, recv, send, res,
            local_sem, recv_sem, send_sem, out_sem, capacity):
    p, k, slots = plan.p, plan.k, plan.slots
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

    def fetch(lane, t):  # local DMA: piece of x needed at step t, HBM -> VMEM slot t % 2
        h, j = divmod(t, k)
        start, size = plan.pieces[j]
        return pltpu.make_async_copy(x_ref.at[chunk(lane, h), pl.ds(start, size)],
                                     local.at[lane, t % 2, pl.ds(0, size)],
                                     local_sem.at[lane, t % 2])

    def message(lane, t):  # remote DMA: message t, my send slot -> downstream's receive slot
        _, way = plan.lanes[lane]
        nbytes = plan.piece_bytes[t % k]
        return pltpu.make_async_remote_copy(
            send.at[lane, t % 2, pl.ds(0, nbytes)], recv.at[lane, t % slots, pl.ds(0, nbytes)],
            send_sem.at[lane, t % 2], recv_sem.at[lane, t % slots],
            device_id={axis: right if way > 0 else left})  # {mesh axis: index}: a mesh id

    def store(lane, t):  # local DMA: decoded result piece, VMEM slot t % 2 -> HBM
        h, j = divmod(t, k)
        start, size = plan.pieces[j]
        return pltpu.make_async_copy(res.at[lane, t % 2, pl.ds(0, size)],
                                     out_ref.at[out_row(lane, h), pl.ds(start, size)],
                                     out_sem.at[lane, t % 2])

    first_store = (p - 1) * k
    for lane in range(len(plan.lanes)):
        fetch(lane, 0).start()
    for t in range(plan.steps):
        h, j = divmod(t, k)
        size, nbytes = plan.pieces[j][1], plan.piece_bytes[j]
        for lane in range(len(plan.lanes)):
            _, way = plan.lanes[lane]
            upstream = left if way > 0 else right
            if t + 1 < p * k:
                fetch(lane, t + 1).start()  # prefetch: overlaps this step's compute
            if h <= p - 1:
                fetch(lane, t).wait()
                mine = local[lane, t % 2, pl.ds(0, size)]
            if h >= 1:  # message t - k: the same piece, one hop earlier
                message(lane, t - k).wait_recv()
                got = recv[lane, (t - k) % slots, pl.ds(0, nbytes)]
                if t - k + slots < plan.messages:  # the slot is free: tell upstream
                    pl.semaphore_signal(capacity.at[lane], 1, device_id={axis: upstream})
            # The fused hop: what this device sends (or keeps) at hop h.
            if h == 0:
                wire = codec.encode(mine)
            elif h <= p - 1:
                wire = codec.encode(codec.decode(got, size) + mine.astype(codec.acc))
            else:
                wire = got  # the all-gather forwards the owner's bytes unchanged
            if h >= p - 1:  # reduced bytes: decode into the result (the owner too)
                if t - 2 >= first_store:
                    store(lane, t - 2).wait()
                res[lane, t % 2, pl.ds(0, size)] = codec.decode(wire, size).astype(res.dtype)
                store(lane, t).start()
            if t < plan.messages:
                if t >= 2:
                    message(lane, t - 2).wait_send()
                send[lane, t % 2, pl.ds(0, nbytes)] = wire
                if t >= slots and sabotage != "capacity":
                    pl.semaphore_wait(capacity.at[lane], 1)
                message(lane, t).start()
    for lane in range(len(plan.lanes)):  # drain: every DMA and signal accounted for
        for t in range(max(plan.messages - 2, 0), plan.messages):
            message(lane, t).wait_send()
        for t in range(max(plan.steps - 2, first_store), plan.steps):
            store(lane, t).wait()
        if sabotage == "capacity":  # the skipped waits, taken at the end: counts balance
            pl.semaphore_wait(capacity.at[lane], max(plan.messages - slots, 0))


def _varying(x: jax.Array) -> frozenset:
    """Mesh axes over which `x` may differ between devices (shard_map's check_vma types);
    jax 0.10 keeps them in `manual_axis_type.varying`, earlier versions in `vma`."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    if mat is not None and hasattr(mat, "varying"):
        return frozenset(mat.varying)
    return frozenset(getattr(aval, "vma", ()) or ())


def _result_type(shape, dtype, varying: frozenset) -> jax.ShapeDtypeStruct:
    """The kernel's output type for shard_map's check_vma: varying over `varying` only (jax
    0.10 says `manual_axis_type`, earlier versions `vma`)."""
    params = inspect.signature(jax.ShapeDtypeStruct).parameters
    if "manual_axis_type" in params:
        from jax.sharding import ManualAxisType

        return jax.ShapeDtypeStruct(shape, dtype, manual_axis_type=ManualAxisType(
            varying=varying))
    if "vma" in params:
        return jax.ShapeDtypeStruct(shape, dtype, vma=varying)
    return jax.ShapeDtypeStruct(shape, dtype)


def _call(plan: RingPlan, codec, axis: str, interpret, sabotage, chunks: jax.Array,
          varying: frozenset):
    """The pallas_call. The device index comes in as an SMEM scalar rather than from
    `lax.axis_index` inside the kernel: interpret mode re-traces the body inside the caller's
    shard_map, where (jax 0.10.2, check_vma=True) arithmetic on the kernel's axis_index fails
    the varying-axes check; a value read from memory is typed like any other."""
    me = lax.axis_index(axis).astype(jnp.int32).reshape(1)
    lanes, slots = len(plan.lanes), plan.slots
    longest = max(size for _, size in plan.pieces)
    widest = max(plan.piece_bytes)
    kernel = functools.partial(_kernel, plan, codec, axis, sabotage)
    return pl.pallas_call(
        kernel,
        out_shape=_result_type((plan.chunks, plan.length), codec.acc, varying),
        in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
        out_specs=pl.BlockSpec(memory_space=pl.ANY),
        scratch_shapes=[
            pltpu.VMEM((lanes, 2, longest), chunks.dtype),  # local: prefetched pieces of x
            pltpu.VMEM((lanes, slots, widest), jnp.uint8),  # recv: k + 1 receive slots
            pltpu.VMEM((lanes, 2, widest), jnp.uint8),  # send: encoded, in flight
            pltpu.VMEM((lanes, 2, longest), codec.acc),  # res: decoded, on their way out
            pltpu.SemaphoreType.DMA((lanes, 2)),
            pltpu.SemaphoreType.DMA((lanes, slots)),
            pltpu.SemaphoreType.DMA((lanes, 2)),
            pltpu.SemaphoreType.DMA((lanes, 2)),
            pltpu.SemaphoreType.REGULAR((lanes,)),  # capacity: free slots downstream
        ],
        compiler_params=pltpu.CompilerParams(collective_id=0),
        interpret=interpret,
    )(me, chunks)


def ring_all_reduce(x: jax.Array, axis_name: str, *, fmt: Format | None = Format.int8(),  # noqa: B008
                    algorithm: str = "ring", num_chunks: int = 1, interpret=None,
                    sabotage: str | None = None) -> jax.Array:
    """Sum `x` over `axis_name` with the Pallas ring kernel. Use inside `jax.shard_map`.

    `eq.all_reduce(x, axis_name, impl="pallas", ...)` calls this after its checks (size gate,
    one device, empty input); called directly it runs the kernel whatever the size.

    Args:
        x: this device's float array; every device passes the same shape.
        axis_name: one mesh axis (the ring).
        fmt: the wire format, or None for x's own dtype bit for bit.
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
    if not isinstance(axis_name, str):
        raise ValueError(f"the Pallas kernel runs over one mesh axis, got {axis_name!r} "
                         "(a 2D torus runs with impl='xla')")
    plan_ring(x.size, lax.axis_size(axis_name), fmt=fmt, algorithm=algorithm,
              num_chunks=num_chunks, dtype=x.dtype)  # checks the arguments
    return _ring(x, axis_name, fmt, algorithm, num_chunks, backend.interpret_params(interpret),
                 sabotage)


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4, 5, 6))
def _ring(x, axis_name, fmt, algorithm, num_chunks, interpret, sabotage):
    """Lay out, run the kernel, cut the padding. Jitted on its own, as collectives' `_run`, so
    an eager shard_map compiles it once; the result is typed the same on every device of the
    ring (varying only over the other mesh axes x varies over)."""
    p, n = lax.axis_size(axis_name), x.size
    plan = plan_ring(n, p, fmt=fmt, algorithm=algorithm, num_chunks=num_chunks, dtype=x.dtype)
    codec = wire_codec(fmt, x.dtype)
    flat = x.reshape(-1)
    if plan.chunks * plan.length > n:
        flat = jnp.pad(flat, (0, plan.chunks * plan.length - n))
    out = _call(plan, codec, axis_name, interpret, sabotage,
                flat.reshape(plan.chunks, plan.length), _varying(x) - {axis_name})
    return out.reshape(-1)[:n].reshape(x.shape).astype(x.dtype)
