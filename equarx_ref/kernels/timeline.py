"""The ring kernel's program laid out in time: what overlaps what, under assumed durations.

`plan_ring(...).program(d)` lists, step by step, what device d's kernel does: which piece of
which hop it computes, which message it waits for, which receive slot that message lands in,
which send slot its own message leaves from, which x piece it prefetches. `kernel_timeline`
runs that list against a clock: each step starts when its inputs are there (its x piece in
VMEM, the awaited message arrived) and its output can leave when the send slot's previous DMA
is done and the downstream receive slot has been read. The result is one event per resource
use (fetch, compute, link, each slot), which `viz.draw_kernel_timeline` draws.

Modelled, not measured: every device runs the same program, so the message a device awaits
leaves its upstream neighbour exactly when its own message of that index leaves; durations are
parameters (one whole chunk's fused hop, message and HBM -> VMEM copy; a piece takes its share),
so plans with different `num_chunks` compare at equal work. Plain Python over the plan's data:
no Pallas here.
"""

from __future__ import annotations

from .._checks import count, number
from .plan import RingPlan

__all__ = ["kernel_timeline"]


def kernel_timeline(plan, *, device: int = 0, lane: int = 0, compute: float = 1.0,
                    link: float = 1.0, fetch: float = 0.25) -> list[tuple]:
    """One device's run of the ring kernel, `(resource, label, piece, start, end)` events.

    `plan` is a `kernels.RingPlan`; `compute`, `link` and `fetch` are the assumed times of one
    whole chunk's fused hop, message and HBM -> VMEM copy (a piece takes its share of them), so
    plans with different `num_chunks` compare at equal work. The steps run in the kernel's
    order: prefetch x for the next step, wait for this step's x and for the awaited message,
    compute, then wait until the send slot's previous DMA is done and the downstream receive
    slot is free (its reader signalled), and start the DMA. Resources: "x → VMEM", "compute",
    "link", "send slot i", "recv slot i" (a slot is busy from the DMA that fills it until it
    is read, or for a send slot until its DMA is done). Labels: the hop (compute, link) or
    "hop.piece" of the message held (slots).
    """
    if not isinstance(plan, RingPlan):
        raise TypeError(f"plan must be a kernels.RingPlan (from plan_ring), got "
                        f"{type(plan).__name__}")
    device = count(device, "device", minimum=0, maximum=plan.p - 1)
    lane = count(lane, "lane", minimum=0, maximum=len(plan.lanes) - 1)
    compute, link, fetch = (number(v, w, positive=False) for v, w in
                            [(compute, "compute"), (link, "link"), (fetch, "fetch")])
    rows = plan.program(device, lane)
    k, slots = plan.k, plan.slots
    share = [size / plan.length for _, size in plan.pieces]
    events = []
    fetched, link_start, link_end, read = {}, {}, {}, {}
    fetch_free = fetch * share[0]  # the kernel starts by fetching step 0's piece
    events.append(("x → VMEM", "0", 0, 0.0, fetch_free))
    fetched[0] = fetch_free
    clock = link_free = 0.0  # clock: the kernel's program order (one scalar core)
    for r in rows:
        t, h, j = r["step"], r["hop"], r["piece"]
        if r["prefetch"] is not None:
            nxt = rows[r["prefetch"]]
            start = max(clock, fetch_free)
            fetch_free = fetched[r["prefetch"]] = start + fetch * share[nxt["piece"]]
            events.append(("x → VMEM", str(nxt["hop"]), nxt["piece"], start, fetch_free))
        ready = max(clock, fetched.get(t, 0.0))
        if r["wait"] is not None:
            hop, piece = r["wait"]
            m = hop * k + piece  # the awaited message's index (its sender's step)
            ready = max(ready, link_end[m])  # upstream sent it when this device sent its m
            read[t] = ready
            events.append((f"recv slot {r['recv_slot']}", f"{hop}.{piece}", piece,
                           link_start[m], ready))
        clock = ready + compute * share[j]
        events.append(("compute", str(h), j, ready, clock))
        if r["send_slot"] is not None:
            written = max(clock, link_end.get(t - 2, 0.0))  # wait_send of the slot's last DMA
            free = read[t - slots + k] if t >= slots else 0.0  # downstream read message t-slots
            clock = max(written, free)
            start = max(clock, link_free)
            link_start[t] = start
            link_free = link_end[t] = start + link * share[j]
            events.append(("link", str(h), j, start, link_free))
            events.append((f"send slot {r['send_slot']}", f"{h}.{j}", j, written, link_free))
    return events
