"""The ring kernel's static plan: sizes, pieces, lanes, receive slots, and each step's program.

Everything about one ring kernel (`ring.py`) that is known when tracing is plain data here,
with no Pallas in it: the layout of the chunks and their pipeline pieces (`schedule.layout`,
whole rows), the wire bytes of each piece, the lanes (one ring, or two in opposite directions
for "bidir_ring") and the k + 1 receive slots of each lane. `RingPlan.program(d)` lists device
d's steps in the order the kernel runs them: which message each step waits for, what it
computes, which slot it sends from. The kernel is written from this list, the tests check it,
`timeline.py` lays it out in time and chapter 07 reads it.
"""

from __future__ import annotations

import dataclasses

from .._checks import count, value_dtype
from ..formats import Format
from ..schedule import SCHEDULES, in_ring_family, layout, make_schedule
from ..wire import Codec, encoded_bytes
from . import tiles

__all__ = ["RingPlan", "plan_ring"]


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
    def sizes(self) -> tuple[int, ...]:
        """The distinct piece lengths (at most two: the layout cuts whole blocks evenly)."""
        return tuple(sorted({size for _, size in self.pieces}))

    @property
    def slot_of(self) -> tuple[tuple[int, int], ...]:
        """Per piece j: (its size class, its index among the pieces of that class)."""
        seen: dict[int, int] = {}
        out = []
        for _, size in self.pieces:
            out.append((self.sizes.index(size), seen.get(size, 0)))
            seen[size] = seen.get(size, 0) + 1
        return tuple(out)

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
    if not in_ring_family(algorithm):
        raise ValueError(f"the Pallas kernel runs algorithm 'ring' or 'bidir_ring', got "
                         f"{algorithm!r} (use impl='xla' for the others)")
    count(p, "p (devices)")
    sched = make_schedule(algorithm, (p,))
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format or None, got {type(fmt).__name__}")
    dtype = value_dtype(dtype, "dtype")
    if fmt is not None and not tiles.supports(fmt):  # the kernel codes with the tile code
        raise ValueError(f"impl='pallas' codes 8-bit and 4-bit elements in blocks that divide "
                         f"128 (the tile code, kernels/tiles.py), not {fmt}; use impl='xla'")
    codec = Codec(fmt, dtype)
    length, pieces = layout(n, sched.chunk_count, codec.align, num_chunks)
    lanes = ((0, +1), (p, -1))[:SCHEDULES[algorithm].lanes]  # lane j: chunks from j p
    return RingPlan(p, n, sched.chunk_count, length, pieces,
                    tuple(encoded_bytes(size, fmt, dtype) for _, size in pieces), lanes,
                    len(pieces) + 1)
