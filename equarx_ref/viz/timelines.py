"""Gantt charts: the modelled pipeline of one device, and the Pallas ring kernel's program in time.

`draw_timeline` draws `models.cost.timeline` (the pipeline of one device: for each piece and
hop, a compute bar and a link bar): with several pieces the link of piece j overlaps the
compute of piece j + 1, the overlap `predicted_time`'s formula prices.

`draw_kernel_timeline` draws `kernels.kernel_timeline` (the ring kernel's plan under assumed
durations): the local fetches of x (HBM -> VMEM), the compute, the link, and which message
occupies each send and receive slot when: the double buffer, drawn.

Both are modelled, not measured; the simulators live with what they simulate, these functions
only draw.
"""

from __future__ import annotations

import matplotlib.pyplot as plt

__all__ = ["draw_kernel_timeline", "draw_timeline"]


def draw_timeline(events, ax=None, title: str | None = None):
    """A Gantt chart of `models.cost.timeline` events: one row for compute, one for the link; each
    bar a piece at a hop, coloured by piece. Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 1.8))
    rows = {"compute": 1, "link": 0}
    cmap = plt.get_cmap("tab10")
    for resource, hop, piece, start, end in events:
        ax.barh(rows[resource], end - start, left=start, height=0.7, color=cmap(piece % 10),
                edgecolor="white", linewidth=0.5)
        if end - start > 0.04 * max(e[4] for e in events):
            ax.text((start + end) / 2, rows[resource], f"{hop}", ha="center", va="center",
                    fontsize=7)
    ax.set_yticks(list(rows.values()))
    ax.set_yticklabels(list(rows))
    ax.set_xlabel("time (labels: hop; colours: piece)")
    if title:
        ax.set_title(title, fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def draw_kernel_timeline(plan, ax=None, title: str | None = None, **durations):
    """Draw `kernels.kernel_timeline(plan, **durations)` as a Gantt chart, one row per
    resource, bars coloured by piece; a dashed line where the owner encodes the full sum (the
    all-gather begins). Returns the Axes."""
    # Imported here, not at the top: the kernels package loads Pallas, and `eq.viz` stays
    # importable without it (whoever has a plan has loaded it already).
    from ..kernels.timeline import kernel_timeline

    events = kernel_timeline(plan, **durations)
    names = ["x → VMEM", "compute", "link", *(f"send slot {i}" for i in range(2)),
             *(f"recv slot {i}" for i in range(plan.slots))]
    y = {name: len(names) - 1 - i for i, name in enumerate(names)}
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 0.32 * len(names) + 1))
    cmap = plt.get_cmap("tab10")
    end = max(e[4] for e in events)
    for resource, label, piece, start, stop in events:
        ax.barh(y[resource], stop - start, left=start, height=0.72, color=cmap(piece % 10),
                alpha=0.85, edgecolor="white", linewidth=0.6)
        if stop - start > 0.012 * end * len(label):
            ax.text((start + stop) / 2, y[resource], label, ha="center", va="center",
                    fontsize=7)
    owner = [e[3] for e in events if e[0] == "compute" and int(e[1]) == plan.p - 1]
    if owner:  # hop p - 1: the owner encodes the full sum; from here on bytes are forwarded
        ax.axvline(min(owner), color="0.3", ls="--", lw=0.8)
        ax.text(min(owner), len(names) - 0.4, " full sum: all-gather from here", fontsize=7,
                va="bottom")
    ax.set_yticks([y[n] for n in names])
    ax.set_yticklabels(names, fontsize=8)
    ax.set_ylim(-0.6, len(names) - 0.1)
    ax.set_xlabel("time (modelled; labels: hop, or hop.piece of the message a slot holds; "
                  "colours: piece)", fontsize=8)
    if title:
        ax.set_title(title, fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax

