"""Schedules: who sends which chunk to whom, as plain data.

An AllReduce over p devices cuts each device's vector into chunks and moves them in steps. The
schedules here are the programs that `collectives.all_reduce` executes; they are data (tuples of
`Transfer`s grouped into `Step`s: program.py), so tests can prove their properties and figures
can draw them.

Ring (reduce-scatter, then all-gather). Chunks 0..p-1. At step s = 0..p-2 device d sends its
partial sum of chunk (d - s - 1) mod p to device d + 1, which adds its own copy of that chunk.
After p - 1 steps device d holds the full sum of chunk d (its *owner*). An all-gather then gives
every device every reduced chunk. Per device that is

    2 (p - 1) / p * n   values sent,  in 2 (p - 1) steps.

Each hop of the reduce-scatter sends a partial sum of one more device than the hop before, which
is where a quantized ring's error builds up (see collectives.py).

Bidirectional ring (the TPU "pincer"). 2p chunks: 0..p-1 travel clockwise as above, p..2p-1
counter-clockwise (d sends chunk p + (d + s + 1) mod p to d - 1). Each step sends two half-size
chunks on two different links: the same bytes as the ring, half of them per link direction, so
on full-duplex links the bandwidth term halves.

2D torus (ring over a pair of mesh axes, shape (p1, p2), device d = i * p2 + j). Chunks
c = a * p2 + b. First a ring along axis 0 over super-chunks of p2 chunks (device (i, j) ends
owning super-chunk i summed over its column), then a ring along axis 1 inside super-chunk i
(device (i, j) ends owning chunk c = d). The all-gather runs back: along axis 1, then axis 0.

Two-shot (QuickReduce, FlashInfer). One all-to-all: device d sends chunk c to its owner c; the
owner sums all p copies, then an all-gather. Each value is quantized exactly twice, whatever p.

One-shot (Dong et al.). One all-gather of every device's whole vector; each device sums the p
copies itself. p - 1 times the bytes of the vector, one quantization per value.

Layout. `layout(n, schedule.chunk_count, align, num_chunks)` says where each value goes: the
flattened input is zero-padded to the schedule's `C` chunks of `L` values, L a multiple of
`align` (a message row, `Format.row`: 128 values, or a block where the block does not divide
128), so padding and chunk ownership depend only on the length, the devices and the format.
Pipelining (`num_chunks=k`) cuts every chunk at row boundaries into k pieces.
An empty input has no chunks at all: nothing is padded, nothing sent.

The all-gather phases are `all_gather` steps: each device contributes the chunks it owns and
receives the others' (on a ring network this is p - 1 forwarding hops of the same bytes; JAX's
`all_gather` also makes the result provably identical on every device, which `shard_map`'s
`check_vma` needs).

The data a schedule is made of (`Transfer`, `Step`, `Schedule`, `HopPlan`) and the one walk
that moves values through a schedule as the executor moves arrays (`walk`, `simulate`) are
program.py's; they are imported here, so `schedule.Schedule` and `schedule.walk` read as
before.

The table. `SCHEDULES` has a row per algorithm (`Algorithm`): its builder and what the rest of
the package reads of it (its lanes, whether it is of the ring family, closed forms of what it
sends), so no other module branches on an algorithm's name. A new schedule is its builder here,
its row, and its entry in the cost model (`models/cost.py`, `PHASES`); the executor, the spec,
the byte count and the error model then run it as they are.

The argument rules of every algorithm live here too (`check_algorithm`), so the executor, the
models and the kernels refuse the same things with the same words.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable

from ._checks import count, flag
from .formats import Format
from .program import HopPlan, Schedule, Step, Transfer, simulate, walk

__all__ = [
    "ALGORITHMS",
    "RING_FAMILY",
    "SCHEDULES",
    "Algorithm",
    "HopPlan",
    "Schedule",
    "Step",
    "Transfer",
    "bidir_ring_schedule",
    "check_algorithm",
    "chunk_count",
    "chunks_sent",
    "device_shape",
    "in_ring_family",
    "layout",
    "make_schedule",
    "one_shot_schedule",
    "ring_schedule",
    "simulate",
    "torus_schedule",
    "two_shot_schedule",
    "walk",
]


def device_shape(p) -> tuple[int, ...]:
    """`p` devices, or a (p1, p2) torus, as a shape of positive integers."""
    shape = tuple(p) if isinstance(p, (tuple, list)) else (p,)
    if not 1 <= len(shape) <= 2:
        raise ValueError(f"p must be a device count or a pair of them (2D torus), got {p!r}")
    return tuple(count(q, "p (devices)") for q in shape)


def check_algorithm(algorithm: str, fmt: Format | None, shape: tuple[int, ...] = (1,),
                    num_chunks: int = 1) -> None:
    """Refuse what `all_reduce` cannot run: unknown names, a fmt that is not a Format, fmt
    with psum, 2D non-rings, a pipeline depth on a non-ring."""
    if not isinstance(algorithm, str) or (algorithm != "psum" and algorithm not in SCHEDULES):
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of "
                         f"{('psum', *SCHEDULES)}")
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format or None, got {type(fmt).__name__}")
    if algorithm == "psum" and fmt is not None:
        raise ValueError("algorithm='psum' is the built-in lax.psum and sends x unquantized: "
                         f"pass fmt=None (or pick {', '.join(map(repr, SCHEDULES))})")
    ring = in_ring_family(algorithm)
    family = tuple(name for name, a in SCHEDULES.items() if a.ring)
    if len(shape) == 2 and not ring:
        raise ValueError(f"a pair of mesh axes (2D torus) takes {family}, not {algorithm!r}")
    count(num_chunks, "num_chunks")
    if num_chunks > 1 and not ring:
        raise ValueError(f"num_chunks (pipelining) applies to {family}, not {algorithm!r}")


def _check_p(p: int, what: str = "p") -> None:
    count(p, what)


def _gather(devices_of_axis, axis, time, name_chunks) -> Step:
    """all_gather along one axis: each device sends its own chunks to the others of its group."""
    transfers = []
    for group in devices_of_axis:
        for src in group:
            mine = name_chunks(src)
            transfers += [Transfer(src, dst, mine) for dst in group if dst != src]
    return Step("all_gather", "gather", axis, time, tuple(transfers))


def _ring_steps(p, devices, chunk_of, direction, axis, t0) -> list[Step]:
    """Reduce-scatter ring over `devices` (an axis group list); chunk_of(pos, s) -> chunk ids."""
    steps = []
    for s in range(p - 1):
        transfers = []
        for group in devices:
            for pos, src in enumerate(group):
                dst = group[(pos + direction) % p]
                transfers.append(Transfer(src, dst, chunk_of(src, pos, s)))
        steps.append(Step("permute", "reduce", axis, t0 + s, tuple(transfers)))
    return steps


def ring_schedule(p: int) -> Schedule:
    """Unidirectional ring over p devices: p chunks, p - 1 reduce steps, an all-gather."""
    _check_p(p)
    group = [list(range(p))]
    steps = _ring_steps(p, group, lambda d, pos, s: ((pos - s - 1) % p,), +1, 0, 0)
    steps.append(_gather(group, 0, p - 1, lambda d: (d,)))
    return Schedule("ring", (p,), p, tuple(steps), tuple((c,) for c in range(p)))


def bidir_ring_schedule(p: int) -> Schedule:
    """Two rings in opposite directions, each on half the data: 2p chunks."""
    _check_p(p)
    group = [list(range(p))]
    cw = _ring_steps(p, group, lambda d, pos, s: ((pos - s - 1) % p,), +1, 0, 0)
    ccw = _ring_steps(p, group, lambda d, pos, s: (p + (pos + s + 1) % p,), -1, 0, 0)
    steps = [st for pair in zip(cw, ccw, strict=True) for st in pair]
    steps.append(_gather(group, 0, p - 1, lambda d: (d, p + d)))
    owners = tuple((c % p,) for c in range(2 * p))
    return Schedule("bidir_ring", (p,), 2 * p, tuple(steps), owners)


def torus_schedule(p1: int, p2: int, bidirectional: bool = False) -> Schedule:
    """Ring reduce-scatter along axis 0 then axis 1 of a (p1, p2) torus; all-gather back.

    With `bidirectional`, each axis runs two opposite rings on halves of the data (2 p1 p2
    chunks, chunk c and c + p1 p2 owned by device c).
    """
    _check_p(p1, "p1")
    _check_p(p2, "p2")
    flag(bidirectional, "bidirectional")
    n = p1 * p2
    cols = [[i * p2 + j for i in range(p1)] for j in range(p2)]  # groups along axis 0
    rows = [[i * p2 + j for j in range(p2)] for i in range(p1)]  # groups along axis 1
    halves = [(0, +1), (n, -1)] if bidirectional else [(0, +1)]

    def along0(base, direction):
        def chunk_of(d, pos, s):
            a = (pos - s - 1) % p1 if direction > 0 else (pos + s + 1) % p1
            return tuple(base + a * p2 + b for b in range(p2))
        return _ring_steps(p1, cols, chunk_of, direction, 0, 0)

    def along1(base, direction):
        def chunk_of(d, pos, s):
            b = (pos - s - 1) % p2 if direction > 0 else (pos + s + 1) % p2
            return (base + (d // p2) * p2 + b,)
        return _ring_steps(p2, rows, chunk_of, direction, 1, p1 - 1)

    steps = []
    for phase in (along0, along1):
        lanes = [phase(base, direction) for base, direction in halves]
        steps += [st for group in zip(*lanes, strict=True) for st in group]
    t = p1 + p2 - 2
    steps.append(_gather(rows, 1, t, lambda d: tuple(base + d for base, _ in halves)))
    steps.append(_gather(cols, 0, t + 1, lambda d: tuple(
        base + (d // p2) * p2 + b for base, _ in halves for b in range(p2))))
    name = "bidir_ring" if bidirectional else "ring"
    owners = tuple((c % n,) for c in range(n * len(halves)))
    return Schedule(name, (p1, p2), n * len(halves), tuple(steps), owners)


def two_shot_schedule(p: int) -> Schedule:
    """All-to-all to the chunk owners, a sum there, an all-gather: two quantizations per value."""
    _check_p(p)
    scatter = tuple(Transfer(src, dst, (dst,)) for src in range(p) for dst in range(p)
                    if src != dst)
    steps = (Step("all_to_all", "reduce", 0, 0, scatter),
             _gather([list(range(p))], 0, 1, lambda d: (d,)))
    return Schedule("two_shot", (p,), p, steps, tuple((c,) for c in range(p)))


def one_shot_schedule(p: int) -> Schedule:
    """Every device gathers every input and sums them itself: one quantization per value."""
    _check_p(p)
    step = _gather([list(range(p))], 0, 0, lambda d: (0,))
    step = dataclasses.replace(step, phase="reduce")
    return Schedule("one_shot", (p,), 1, (step,), (tuple(range(p)),))


# ---- the table: what the rest of the package reads of an algorithm -------------------------


@dataclasses.dataclass(frozen=True)
class Algorithm:
    """An algorithm with a schedule here, as every other module reads it: by its properties,
    never by its name. A new schedule is its builder above and its row in `SCHEDULES`, plus
    its entry in the cost model (`models/cost.py`'s `PHASES`).

    Attributes:
        build: its schedule over one mesh axis of p devices.
        lanes: rings that run at once in opposite directions, each on its own chunks (the
            bidirectional ring: 2); their chunks `lanes * p`, lane j's first `j * p`.
        ring: of the ring family: it pipelines (`num_chunks`), runs over a pair of mesh axes
            (`torus_schedule`, bidirectional with two lanes) and as one Pallas kernel.
        sent: chunk-sized messages one device sends over a shape `(p,)` or `(p1, p2)`, in
            closed form (a v5p slice has thousands of chips, and a ring p^2 transfers): held
            against `Schedule.chunks_sent` in the tests. None: counted off the schedule.
        sizes: the sum of the sizes (inputs summed) of the partial sums chunk 0's final value
            was quantized at, in closed form, held against the walk (`models/error.py`,
            which walks the schedule where this is None).
        chunks: the schedule's `chunk_count` on a shape, in closed form (None: built).
    """

    build: Callable[[int], Schedule]
    lanes: int = 1
    ring: bool = False
    sent: Callable[[tuple[int, ...]], int] | None = None
    sizes: Callable[[tuple[int, ...]], int] | None = None
    chunks: Callable[[tuple[int, ...]], int] | None = None


def _axes(shape: tuple[int, ...]) -> tuple[int, int]:
    """(p1, p2) of a torus, (p, 1) of one axis: a ring is a torus of one column."""
    return (*shape, 1)[:2]


def _ring_family(lanes: int, build: Callable[[int], Schedule]) -> Algorithm:
    """A ring of `lanes` lanes, over one axis or a torus (reduce along 0, then 1; gather
    back): 2 p2 (p1 - 1) + 2 (p2 - 1) chunks sent per lane, and a value of chunk 0 quantized
    at sizes 1 .. p1 - 1 (times p2), then p1 .. p1 (p2 - 1), then at the gather p1 p2."""
    return Algorithm(
        build, lanes, ring=True,
        sent=lambda shape: lanes * (2 * _axes(shape)[1] * (_axes(shape)[0] - 1)
                                    + 2 * (_axes(shape)[1] - 1)),
        sizes=lambda shape: (math.prod(shape) * (_axes(shape)[0] - 1) // 2
                             + math.prod(shape) * (_axes(shape)[1] - 1) // 2 + math.prod(shape)),
        chunks=lambda shape: lanes * math.prod(shape))


#: Every algorithm with a schedule here, in the order tables list them ("psum", `lax.psum`
#: itself, has none). Read at call time: a row added here is an algorithm everywhere.
SCHEDULES: dict[str, Algorithm] = {
    "ring": _ring_family(1, ring_schedule),
    "bidir_ring": _ring_family(2, bidir_ring_schedule),
    "two_shot": Algorithm(two_shot_schedule, sent=lambda shape: 2 * (shape[0] - 1),
                          sizes=lambda shape: 2 * shape[0], chunks=lambda shape: shape[0]),
    "one_shot": Algorithm(one_shot_schedule, sent=lambda shape: shape[0] - 1,
                          sizes=lambda shape: shape[0], chunks=lambda shape: 1),
}
#: Every algorithm `all_reduce` runs; "psum" is `lax.psum` itself, the others are schedules here.
ALGORITHMS = ("psum", *SCHEDULES)
#: The rings: they pipeline (`num_chunks`), run over a pair of axes (2D torus) and as a kernel.
RING_FAMILY = tuple(name for name, a in SCHEDULES.items() if a.ring)


def in_ring_family(algorithm: str) -> bool:
    """Whether `algorithm` is a ring (`Algorithm.ring`): it pipelines, runs over a torus and
    as a kernel. "psum", unknown names and non-strings are not."""
    return isinstance(algorithm, str) and algorithm in SCHEDULES and SCHEDULES[algorithm].ring


def make_schedule(algorithm: str, shape: tuple[int, ...]) -> Schedule:
    """The schedule of `algorithm` (any of `ALGORITHMS` but "psum") on `shape` (p,) or (p1, p2)."""
    if not isinstance(algorithm, str) or algorithm not in SCHEDULES:
        raise ValueError(f"unknown algorithm {algorithm!r} for a schedule; "
                         f"choose one of {tuple(SCHEDULES)}")
    if not isinstance(shape, (tuple, list)) or len(shape) not in (1, 2):
        raise ValueError(f"schedules run over one mesh axis or a pair: shape must be (p,) or "
                         f"(p1, p2), got {shape!r}")
    shape = tuple(count(q, "shape (devices per axis)") for q in shape)
    if len(shape) == 2:
        check_algorithm(algorithm, None, shape)
        return torus_schedule(*shape, bidirectional=SCHEDULES[algorithm].lanes == 2)
    return SCHEDULES[algorithm].build(shape[0])


def chunk_count(algorithm: str, shape: tuple[int, ...]) -> int:
    """The chunks `algorithm`'s schedule cuts a vector into on `shape` (closed form where its
    row has one: no schedule built)."""
    closed = SCHEDULES[algorithm].chunks
    return closed(shape) if closed else make_schedule(algorithm, shape).chunk_count


def chunks_sent(algorithm: str, shape: tuple[int, ...]) -> int:
    """Chunk-sized messages one device sends (every device as many) in `algorithm`'s schedule
    on `shape` (closed form where its row has one)."""
    closed = SCHEDULES[algorithm].sent
    return closed(shape) if closed else make_schedule(algorithm, shape).chunks_sent(0)



def layout(n: int, chunks: int, align: int, num_chunks: int = 1
           ) -> tuple[int, tuple[tuple[int, int], ...]]:
    """Chunk length L (a multiple of `align`) and the pipeline pieces `((start, length), ...)`.

    `n` values are cut into `chunks` chunks (a schedule's `chunk_count`) of `L` values each,
    zero-padded at the end; with `num_chunks=k` each chunk is cut into at most k pieces of whole
    `align` units (never more pieces than units). n = 0 gives L = 0 and no pieces.
    """
    n = count(n, "n (values)", minimum=0)
    chunks, align = count(chunks, "chunks"), count(align, "align")
    num_chunks = count(num_chunks, "num_chunks")
    units = -(-n // (chunks * align))  # aligned units per chunk
    k = min(num_chunks, units)
    bounds = [units * j // k for j in range(k + 1)] if k else [0]
    pieces = tuple((a * align, (b - a) * align) for a, b in itertools.pairwise(bounds))
    return units * align, pieces
