"""A schedule as data: transfers grouped into steps, and the one walk that moves values along.

An AllReduce program is plain data, so tests can prove its properties and figures can draw it:
a `Transfer` (one device sends a run of chunks to another), a `Step` (one collective operation:
a permute, an all-to-all or an all-gather, in the reduce or the gather phase) and a `Schedule`
(the steps in order, the chunks and who owns each one's sum at the end). A `HopPlan` says which
wire format each reduce step and the gather phase send in. The algorithms that build schedules,
and the table the rest of the package reads them by, are schedule.py's.

The one walk. `walk(schedule, start, send, add)` moves symbolic values exactly as the executor
moves arrays: a reduce hop delivers `send(value)` and the receiver adds its own copy; an
all-to-all or a reduce-phase all-gather sends every contribution (the receiver's own included:
the executor encodes the whole buffer); the gather phase sends each owner's sum once and
forwards it. `simulate` (which inputs each result sums), the error model's quantization
histories and the hop plans' step weights are all this one walk with different values, so
none of them can disagree with the executor about who adds what.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable

from .formats import Format

__all__ = ["HopPlan", "Schedule", "Step", "Transfer", "simulate", "walk"]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """`src` sends its current copy of `chunks` (consecutive chunk ids) to `dst`."""

    src: int
    dst: int
    chunks: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Step:
    """One collective operation.

    Attributes:
        kind: "permute" (each device sends at most one transfer: one `ppermute`), "all_to_all"
            or "all_gather".
        phase: "reduce" (the receiver adds what it gets to its own copy) or "gather" (it stores).
        axis: which mesh axis the step runs along (0, or 1 for the second axis of a torus).
        time: steps with the same time are independent and may run at once (bidirectional ring).
        transfers: everything sent in the step.
    """

    kind: str
    phase: str
    axis: int
    time: int
    transfers: tuple[Transfer, ...]


@dataclasses.dataclass(frozen=True)
class Schedule:
    """An AllReduce program over devices `0..p-1` (row-major over `shape`).

    Attributes:
        name: the algorithm.
        shape: devices per mesh axis, `(p,)` or `(p1, p2)`.
        chunk_count: chunks each device's vector is cut into (each may be cut again into
            pipeline pieces: `layout`'s `num_chunks`).
        steps: the collective operations, in order.
        owners: for each chunk, the devices holding its full sum after the reduce phase.
    """

    name: str
    shape: tuple[int, ...]
    chunk_count: int
    steps: tuple[Step, ...]
    owners: tuple[tuple[int, ...], ...]

    @property
    def p(self) -> int:
        out = 1
        for s in self.shape:
            out *= s
        return out

    def chunks_sent(self, device: int, phase: str | None = None) -> int:
        """Chunk-sized messages `device` sends (the wire-byte count, in chunks)."""
        return sum(len(t.chunks) for st in self.steps if phase in (None, st.phase)
                   for t in st.transfers if t.src == device)


@dataclasses.dataclass(frozen=True)
class HopPlan:
    """One wire format per reduce step (indexed by the schedule's step time) and one for the
    gather phase: what the executor sends each step in (`all_reduce(..., hop_bits=)`; the error
    model chooses one, `models/hops.py`). Hashable: it is a static argument of the compiled
    collective."""

    reduce: tuple[tuple[int, Format], ...]  # (step time, format), in time order
    gather: Format | None

    @property
    def align(self) -> int:
        """The chunk alignment every format of the plan needs: whole message rows of each
        (`Format.row`; rows are 128 values, or powers-of-two multiples of one base block, so
        the longest is a multiple of all)."""
        return max(f.row for f in self.formats)

    @property
    def formats(self) -> list[Format]:
        return [f for _, f in self.reduce] + ([self.gather] if self.gather else [])

    def __str__(self) -> str:
        steps = " ".join(str(f) for _, f in self.reduce)
        return f"reduce [{steps}]" + (f", gather {self.gather}" if self.gather else "")


def walk(schedule: Schedule, start: Callable, send: Callable, add: Callable) -> list[list]:
    """Move symbolic values through `schedule` as the executor moves arrays (module essay).

    `start(device, chunk)` is a device's input value of a chunk; `send(value, time)` is what
    arrives of a value sent at a reduce step's `time` (or by the gather phase: time None), which
    is where a quantization happens; `add(a, b)` sums two values. Returns `held[device][chunk]`,
    every device's final value of every chunk.
    """
    p, chunks = schedule.p, schedule.chunk_count
    held = [[start(d, c) for c in range(chunks)] for d in range(p)]
    for step in (s for s in schedule.steps if s.phase == "reduce"):
        if step.kind == "permute":  # the receiver adds its own copy to what arrives
            arriving = [(t.dst, c, send(held[t.src][c], step.time))
                        for t in step.transfers for c in t.chunks]
            for d, c, value in arriving:
                held[d][c] = add(held[d][c], value)
        else:  # all_to_all / all_gather: every contribution is sent, the receiver's own too
            parts: dict[tuple[int, int], list] = {}
            for t in step.transfers:
                for c in t.chunks:
                    parts.setdefault((t.dst, c), [held[t.dst][c]]).append(held[t.src][c])
            for (d, c), values in parts.items():
                held[d][c] = functools.reduce(add, [send(v, step.time) for v in values])
    gathers = [s for s in schedule.steps if s.phase == "gather"]
    if gathers:  # each owner sends its sum once; the gathers forward those same bytes
        for c, owners in enumerate(schedule.owners):
            for d in owners:
                held[d][c] = send(held[d][c], None)
        for step in gathers:
            arriving = [(t.dst, c, held[t.src][c]) for t in step.transfers for c in t.chunks]
            for d, c, value in arriving:
                held[d][c] = value
    return held


def simulate(schedule: Schedule) -> list[list[Counter]]:
    """Run a schedule on symbols: which inputs each device's copy of each chunk sums, at the end.

    Returns `held[device][chunk]`, a Counter of input devices (a count of 2 would mean an input
    was added twice). A correct AllReduce ends with every count exactly 1 on every device.
    """
    if not isinstance(schedule, Schedule):
        raise TypeError(f"schedule must be a Schedule (make_schedule, ring_schedule, ...), "
                        f"got {schedule!r}")
    return walk(schedule, lambda d, c: Counter({d: 1}), lambda v, time: v.copy(),
                lambda a, b: a + b)
