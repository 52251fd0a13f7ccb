"""The reference sum of every schedule: what `all_reduce` must return, step by step in NumPy.

A schedule is plain data (the package's `Schedule`, or anything with the same fields):
`chunk_count`, `owners` (chunk -> devices holding it reduced) and `steps`, each with `time`,
`phase` ("reduce" or "gather"), `kind` ("permute", "all_to_all", "all_gather") and
`transfers` (each `src`, `dst`, `chunks`); its devices are `p` (or the product of `shape`)
where it has them, else 1 + the largest device it names. The inputs `x` have one row per
device, exactly: a schedule of 4 devices refuses 8 rows (it would sum the first 4).

Which call this is. `all_reduce(x, schedule, fmt)` is what the package's `eq.all_reduce(...,
fmt=fmt, algorithm=...)` returns when it sends every message in `fmt`, i.e. with
`min_bytes=0`. By default (`min_bytes=None`) the package sends a message unquantized when
quantizing it would send no fewer bytes (a short message padded to whole blocks): its result
is then `all_reduce(x, schedule, None)`, the unquantized sum, which the spec gives for
`fmt=None`. The gate is the package's policy (`predict.quantizing_saves_bytes`), not a rule
of the numbers; the spec computes the sum of the format it is asked for.

Each message is what a receiver decodes: dequantize(quantize(v)) (or, with no format, v
rounded to x's dtype). A reduce hop adds it to the receiver's f32 copy; an all-to-all or a
reduce-phase all-gather sums every device's message, the receiver's own included, in rank
order, one f32 addition at a time; the gather phase hands everyone the owner's chunk,
encoded once, so every device ends with the same bits. With a format, every f32 value a step
adds, and every partial sum, reads a subnormal as a zero of its sign (what XLA:CPU and TPUs do
to a subnormal operand, and what the package does explicitly everywhere else), so no sum
depends on whether a backend flushes.
"""

from __future__ import annotations

import numpy as np

from . import _checks
from .formats import F32_TINY, check_format
from .quantize import round_trip
from .wire import row_values

PHASES = ("reduce", "gather")
KINDS = ("permute", "all_to_all", "all_gather")


def _devices(schedule) -> int:
    """The schedule's device count: `p`, the product of `shape`, or 1 + the largest device
    its owners and transfers name."""
    if getattr(schedule, "p", None) is not None:
        return _checks.count(schedule.p, "schedule.p")
    if getattr(schedule, "shape", None) is not None:
        shape = schedule.shape
        if not isinstance(shape, (tuple, list)) or not shape:
            raise TypeError(f"schedule.shape must be a tuple of devices per axis, got {shape!r}")
        return int(np.prod([_checks.count(q, "schedule.shape") for q in shape]))
    named = [d for devices in schedule.owners for d in devices]
    named += [d for step in schedule.steps for t in step.transfers for d in (t.src, t.dst)]
    if not named:
        raise ValueError("schedule names no device (in owners or transfers) and has no p or "
                         "shape to count them by")
    return 1 + max(_checks.count(d, "a device of schedule", minimum=0) for d in named)


def check_schedule(schedule) -> int:
    """`schedule`'s device count, once its fields are plain data the sum can follow (module
    essay): counts, devices and chunks in range, known phases and kinds; else a ValueError or
    TypeError naming the field."""
    try:
        return _check_schedule(schedule)
    except (AttributeError, KeyError, IndexError) as e:  # a field of the wrong shape
        raise TypeError(f"schedule must be plain data with the fields of the package's "
                        f"Schedule (module essay): {type(e).__name__}: {e}"[:300]) from None
    except TypeError as e:
        if str(e).startswith("schedule"):
            raise
        raise TypeError(f"schedule must be plain data with the fields of the package's "
                        f"Schedule (module essay): {e}"[:300]) from None


def _check_schedule(schedule) -> int:
    missing = [f for f in ("chunk_count", "owners", "steps") if not hasattr(schedule, f)]
    if missing:
        raise TypeError(f"schedule must have the fields chunk_count, owners and steps (the "
                        f"package's Schedule, or any with them), got {type(schedule).__name__} "
                        f"without {', '.join(missing)}")
    chunks = _checks.count(schedule.chunk_count, "schedule.chunk_count")
    p = _devices(schedule)

    def device(d, what):
        return _checks.count(d, what, minimum=0, maximum=p - 1)

    if len(schedule.owners) != chunks:
        raise ValueError(f"schedule.owners must name the owners of each of the {chunks} chunks, "
                         f"got {len(schedule.owners)}")
    for c, devices in enumerate(schedule.owners):
        if not len(devices):
            raise ValueError(f"schedule.owners[{c}] must name at least one device")
        for d in devices:
            device(d, f"schedule.owners[{c}]")
    for i, step in enumerate(schedule.steps):
        if step.phase not in PHASES or step.kind not in KINDS:
            raise ValueError(f"schedule.steps[{i}] must have a phase in {PHASES} and a kind in "
                             f"{KINDS}, got {step.phase!r}, {step.kind!r}")
        for t in step.transfers:
            device(t.src, f"schedule.steps[{i}] source")
            device(t.dst, f"schedule.steps[{i}] destination")
            for c in t.chunks:
                _checks.count(c, f"schedule.steps[{i}] chunk", minimum=0, maximum=chunks - 1)
    return p


def _plan(plan, schedule, fmt):
    """A hop-aware plan ({reduce step time: format}, gather format), every format checked and
    every time one of the schedule's reduce steps."""
    if fmt is None:
        raise ValueError("plan is per-hop formats of a quantized sum: it needs fmt, got None")
    if not isinstance(plan, (tuple, list)) or len(plan) != 2 or not isinstance(plan[0], dict):
        raise TypeError(f"plan must be ({{step time: format}}, gather format), got "
                        f"{type(plan).__name__}")
    steps_fmt, gather_fmt = plan
    times = {s.time for s in schedule.steps if s.phase == "reduce"}
    unknown = sorted(set(steps_fmt) - times, key=str)
    if unknown:
        raise ValueError(f"plan names step times {unknown} that are not the schedule's reduce "
                         f"steps {sorted(times)}")
    for t, f in steps_fmt.items():
        check_format(f, f"plan's format of step {t}")
    check_format(gather_fmt, "plan's gather format")
    return dict(steps_fmt), gather_fmt


def all_reduce(x: np.ndarray, schedule, fmt, plan=None) -> np.ndarray:
    """What `all_reduce` must return for inputs `x` [p, ...], following `schedule`: the
    package's `eq.all_reduce(..., fmt=fmt, min_bytes=0)` (every message in `fmt`; module
    essay: the default size gate may send a short message unquantized, the sum of
    `fmt=None`).

    `x` holds one row per device of the schedule, floats (the dtype the sum returns, and the
    one an unquantized message travels in). `plan` (hop-aware bits): ({step time: format},
    gather format); chunks are then padded to the longest row of the plan, and each step's
    messages use its own format. Padding and chunk ownership depend only on (length,
    devices, row): C chunks of L values, L a whole number of message rows (wire.py: 128
    values when the block divides 128, else a block).
    """
    p_schedule = check_schedule(schedule)
    if fmt is not None:
        check_format(fmt)
    x = _checks.array(x, "x", min_ndim=1)
    if x.shape[0] != p_schedule:
        raise ValueError(f"x must have one row per device of the schedule, {p_schedule}, got "
                         f"{x.shape[0]} (shape {x.shape})")
    p, n = x.shape[0], x[0].size
    dtype = x.dtype
    steps_fmt, gather_fmt = _plan(plan, schedule, fmt) if plan is not None else ({}, fmt)
    align = max([row_values(f) for f in (fmt, gather_fmt, *steps_fmt.values())]) \
        if fmt is not None else 1
    C = schedule.chunk_count
    L = -(-n // (C * align)) * align
    acc = np.zeros((p, C * L), np.float32)
    acc[:, :n] = x.reshape(p, n).astype(np.float32)
    acc = acc.reshape(p, C, L)

    def message(v, f=fmt):  # v [..., L] f32 -> what the receiver decodes, f32
        if f is None:
            return v.astype(dtype).astype(np.float32)
        return round_trip(v.reshape(-1), f).reshape(v.shape)

    def settle(v):  # with a format: subnormals read as zeros of their sign
        if fmt is None:
            return v
        return np.where(np.abs(v) < F32_TINY, np.copysign(np.float32(0), v), v)

    def rank_order_sum(parts):
        total = parts[0]
        for part in parts[1:]:
            total = settle(total + part)  # f32 additions, one at a time, rank 0 first
        return total

    for step in (s for s in schedule.steps if s.phase == "reduce"):
        new = acc.copy()  # a step reads everyone's copies from before it
        f = steps_fmt.get(step.time, fmt)
        if step.kind == "permute":
            for t in step.transfers:
                for c in t.chunks:
                    new[t.dst, c] = message(acc[t.src, c], f) + settle(acc[t.dst, c])
        elif step.kind == "all_to_all":
            senders = {}
            for t in step.transfers:
                for c in t.chunks:
                    senders.setdefault((t.dst, c), {t.dst}).add(t.src)
            for (d, c), srcs in senders.items():
                new[d, c] = rank_order_sum([message(acc[r, c], f) for r in sorted(srcs)])
        elif step.kind == "all_gather":
            total = rank_order_sum([message(acc[r], f) for r in range(p)])
            new[:] = total
        acc = new
    if any(s.phase == "gather" for s in schedule.steps):
        out = np.stack([message(acc[schedule.owners[c][0], c], gather_fmt) for c in range(C)])
    else:
        out = acc[0]
    return out.reshape(-1)[:n].reshape(x.shape[1:]).astype(dtype)
