"""Hop-aware bit allocation: more bits where the partial sums are larger, the same bytes.

A quantized ring re-quantizes partial sums. Reduce step t of a ring over p devices sends partial
sums of t + 1 inputs; the gather sends the full sum of p. One quantization of a value whose
variance is k s^2 with a format of relative error c(F) adds error variance c(F)^2 k s^2, so with
format F_t at step t and F_g for the gather (`error.py`'s argument, one format per step):

    relative error^2 = ( sum_t w_t c(F_t)^2 + w_g c(F_g)^2 ) / p

with w_t the sizes of the partial sums step t quantizes in one value's history (ring: t + 1;
gather: p). The bytes are sum_t n_t bits(F_t) + n_g bits(F_g), n_t the chunks one device sends
in step t (ring: 1 a step, p - 1 in the gather). Every bit on the gather costs p - 1 times a bit
on a reduce hop, so the gather keeps about the budget's width and the late reduce hops get more.

With continuous widths the optimum (Lagrange) gives every send an error share proportional to
its cost, c(F_t)^2 w_t = lambda n_t; here the widths are integers (from two below `fmt`'s to
three above, `int6` ... `int11` around int8, bit-packed) and the block may grow in powers of
two (fewer scale bits: int9 with a bf16 scale per 128 values costs 9.125 bits), and
`hop_plan` finds a plan (Lagrangian relaxation, then the leftover bits spent greedily: a
heuristic, not an exact search) under the budget: bits per element on the wire no more than
`fmt`'s. c(F) is `error.gaussian_relative_error`, the model for i.i.d. Gaussian data.

What it reaches (Gaussian data, an int8 budget of 8.5 bits): the ring's modelled error falls
below the uniform plan's c sqrt((p + 1) / 2) (`predicted_relative_error(...,
hop_bits="adaptive")`; the sweep stores what it reaches on data, data/sweep.json), but not to
the two-shot algorithm's sqrt(2) c. The reason is structural: the ring's reduce-scatter
quantizes sums of 1 + 2 + ... + (p - 1) inputs against the two-shot's p single inputs, and no
allocation of the same bytes removes that factor of (p - 1) / 2 in the reduce half. Plans are
built for up to `MAX_DEVICES` devices.
"""

from __future__ import annotations

import functools
import math

from .._checks import count
from ..formats import Format
from ..rules import HOP_BITS, check_hop_bits
from ..schedule import SCHEDULES, HopPlan, Schedule, check_algorithm, device_shape, make_schedule
from .error import gaussian_relative_error, quantizations

__all__ = ["HOP_BITS", "MAX_DEVICES", "HopPlan", "check_hop_bits", "hop_plan", "step_weights"]

#: Largest device count a hop-aware plan is searched for.
MAX_DEVICES = 256
_WIDTH_RANGE = (-2, 3)  # integer widths a plan may use: fmt's - 2 to fmt's + 3, in [2, 12]
_BLOCK_GROWTH = 4  # blocks fmt.block_size * 2^j, j = 0..4


def step_weights(sched: Schedule) -> tuple[dict[int, tuple[int, int]], tuple[int, int]]:
    """Per reduce step time: (w, n) = (sizes of the partial sums that step quantizes in the
    history of chunk 0's final value, chunks one device sends); and the same pair for the
    gather phase (module essay). The history is `error.quantizations`, the schedule's walk."""
    sent: dict[int, int] = {}
    for step in (s for s in sched.steps if s.phase == "reduce"):
        sent[step.time] = sent.get(step.time, 0) + sum(
            len(t.chunks) for t in step.transfers if t.src == 0)
    gathered = sched.chunks_sent(0, "gather")
    weights = dict.fromkeys(sent, 0)
    for time, k in quantizations(sched)[0]:
        if time is not None:
            weights[time] += k
    return {t: (weights[t], sent[t]) for t in sorted(sent)}, ((sched.p, gathered) if gathered
                                                               else (0, 0))


@functools.cache
def _variance(fmt: Format) -> float:
    return gaussian_relative_error(fmt) ** 2


def _options(fmt: Format) -> list[Format]:
    out = []
    lo, hi = (min(max(fmt.elem_bits + d, 2), 12) for d in _WIDTH_RANGE)
    for b in range(lo, hi + 1):
        for j in range(_BLOCK_GROWTH + 1):
            block = fmt.block_size << j
            if block * b % 8 == 0:
                out.append(Format(f"int{b}", block, fmt.scale_dtype))
    return out


@functools.cache
def hop_plan(p, *, fmt: Format, algorithm: str, hop_bits: str = "adaptive") -> HopPlan:
    """The format of every reduce step and of the gather for `algorithm` on `p` devices.

    "uniform": `fmt` everywhere. "adaptive": the integer widths and blocks (`fmt`'s scale
    type) that minimise the modelled error with no more bits per element on the wire than
    `fmt` (module essay). Deterministic: every device computes the same plan.
    """
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape)
    check_hop_bits(hop_bits, fmt)
    if algorithm not in SCHEDULES:
        raise ValueError("psum sends nothing quantized: it has no hop plan")
    sched = make_schedule(algorithm, shape)
    steps, (wg, ng) = step_weights(sched)
    if hop_bits == "uniform" or sched.p == 1:
        return HopPlan(tuple((t, fmt) for t in steps), fmt if ng else None)
    count(sched.p, "devices for hop_bits='adaptive'", maximum=MAX_DEVICES)
    items = [(w, n) for w, n in steps.values()] + ([(wg, ng)] if ng else [])
    chosen = _search(tuple(items), fmt)
    plan = tuple(zip(steps, chosen[:len(steps)], strict=True))
    return HopPlan(plan, chosen[-1] if ng else None)


def _search(items: tuple[tuple[int, int], ...], fmt: Format) -> list[Format]:
    """Minimise sum w v(F) subject to sum n bits(F) <= sum n bits(fmt), costs exact integers
    in units of 1 / (largest block) bits. Lagrangian relaxation (each item alone minimises
    w v + lambda n bits; bisect lambda to the cheapest multiplier within budget), then the
    leftover budget spent greedily on the upgrade with the best error saved per bit."""
    opts = _options(fmt)
    unit = max(f.block_size for f in opts)

    def cost(f: Format) -> int:  # bits per element times `unit`, exactly
        return f.elem_bits * unit + f.scale_bits * unit // f.block_size

    budget = sum(n for _, n in items) * cost(fmt)

    def pick(lam: float) -> list[Format]:
        return [min(opts, key=lambda f, w=w, n=n: (w * _variance(f) + lam * n * cost(f),
                                                   cost(f))) for w, n in items]

    def spent(plan):
        return sum(n * cost(f) for (_, n), f in zip(items, plan, strict=True))

    lo, hi = 0.0, 1.0
    while spent(pick(hi)) > budget:
        lo, hi = hi, hi * 4
    for _ in range(60):  # the feasible multiplier closest to the budget
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if spent(pick(mid)) <= budget else (mid, hi)
    plan = pick(hi)
    while True:  # greedy: the affordable change that saves the most error per bit
        left, best = budget - spent(plan), None
        for i, (w, n) in enumerate(items):
            for f in opts:
                extra = n * (cost(f) - cost(plan[i]))
                gain = w * (_variance(plan[i]) - _variance(f))
                if gain > 0 and extra <= left:
                    score = gain / max(extra, 1)
                    if best is None or score > best[0]:
                        best = (score, i, f)
        if best is None:
            return plan
        plan[best[1]] = best[2]


def plan_bits_per_element(plan: HopPlan, p, *, algorithm: str) -> float:
    """Bits per element on the wire, averaged over what one device sends."""
    steps, (_, ng) = step_weights(make_schedule(algorithm, device_shape(p)))
    sends = [(steps[t][1], f) for t, f in plan.reduce] + ([(ng, plan.gather)] if ng else [])
    return sum(n * f.bits_per_element for n, f in sends) / sum(n for n, _ in sends)


def plan_relative_error(plan: HopPlan, p, *, algorithm: str) -> float:
    """The modelled relative error of a plan on i.i.d. Gaussian inputs (module essay)."""
    shape = device_shape(p)
    steps, (wg, ng) = step_weights(make_schedule(algorithm, shape))
    total = sum(steps[t][0] * _variance(f) for t, f in plan.reduce)
    total += wg * _variance(plan.gather) if ng else 0.0
    return math.sqrt(total / math.prod(shape))
