"""The reference sum of every schedule: what `all_reduce` must return, step by step in NumPy.

A schedule is plain data (the package's `Schedule`, or anything with the same fields):
`chunk_count`, `owners` (chunk -> devices holding it reduced) and `steps`, each with `time`,
`phase` ("reduce" or "gather"), `kind` ("permute", "all_to_all", "all_gather") and
`transfers` (each `src`, `dst`, `chunks`).

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

from .formats import F32_TINY
from .quantize import round_trip
from .wire import row_values


def all_reduce(x: np.ndarray, schedule, fmt, plan=None) -> np.ndarray:
    """What `all_reduce` must return for inputs `x` [p, ...], following `schedule`.

    `plan` (hop-aware bits): ({step time: format}, gather format); chunks are then padded to
    the longest row of the plan, and each step's messages use its own format. Padding and
    chunk ownership depend only on (length, devices, row): C chunks of L values, L a whole
    number of message rows (wire.py: 128 values when the block divides 128, else a block).
    """
    x = np.asarray(x)
    p, n = x.shape[0], x[0].size
    dtype = x.dtype
    steps_fmt, gather_fmt = plan if plan is not None else ({}, fmt)
    align = max([row_values(f) for f in (fmt, gather_fmt, *steps_fmt.values())]) \
        if fmt is not None else 1
    C = schedule.chunk_count
    L = -(-n // (C * align)) * align
    acc = np.zeros((p, C * L), np.float32)
    acc[:, :n] = x.reshape(p, -1).astype(np.float32)
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
        else:
            raise AssertionError(step.kind)
        acc = new
    if any(s.phase == "gather" for s in schedule.steps):
        out = np.stack([message(acc[schedule.owners[c][0], c], gather_fmt) for c in range(C)])
    else:
        out = acc[0]
    return out.reshape(-1)[:n].reshape(x.shape[1:]).astype(dtype)
