"""Figures of the schedules and of the network they run on: who sends what to whom, when.

`draw_schedule` draws a `Schedule` as a table: one row per device, one column per time step,
each cell naming what that device sends then ("c3 -> 1": its copy of chunk 3 to device 1),
coloured by chunk, reduce steps first, then the all-gather. It reads the same step list the
collectives execute and the models count, so the picture is of the code that runs.

`draw_torus` draws a TPU slice as its ICI network: chips as nodes, numbered as a mesh of that
shape numbers its devices (row-major), links between neighbours, wraparound links as short
stubs at the edges, and one ring (the chips along one axis through chip 0) in colour, with its
wraparound as an arc and its direction(s) as arrows. 2D (v5e, v6e) and 3D (v4, v5p) shapes; a
3D slice is drawn in an oblique projection, one layer per index of the last axis. Along an axis
without wraparound links a ring is a line: it comes back over the links it went out on.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch

from ..schedule import Schedule

__all__ = ["draw_schedule", "draw_torus"]


def _label(step, transfers) -> str:
    if step.kind == "permute":
        return "\n".join(f"c{t.chunks[0]}" + (f"-{t.chunks[-1]}" if len(t.chunks) > 1 else "")
                         + f" → {t.dst}" for t in transfers)
    chunks = sorted({c for t in transfers for c in t.chunks})
    what = ",".join(f"c{c}" for c in chunks)
    return f"{step.kind.replace('_', '-')}\n{what} → {len(transfers)}"


def draw_schedule(schedule: Schedule, ax=None, title: str | None = None):
    """Draw who sends which chunk to whom at each step. Returns the matplotlib Axes."""
    columns = defaultdict(list)  # (phase order, time) -> steps
    for step in schedule.steps:
        columns[(step.phase != "reduce", step.time)].append(step)
    keys = sorted(columns)
    p = schedule.p
    if ax is None:
        _, ax = plt.subplots(figsize=(1.3 * len(keys) + 1.2, 0.45 * p + 1.2))
    cmap = plt.get_cmap("tab20")
    for col, key in enumerate(keys):
        for d in range(p):
            sent = [(st, t) for st in columns[key] for t in st.transfers if t.src == d]
            if not sent:
                continue
            first = sent[0][1].chunks[0]
            color = cmap(first % 20) if key[0] is False else (0.85, 0.85, 0.85, 1.0)
            ax.add_patch(plt.Rectangle((col, d), 0.95, 0.9, color=color, alpha=0.75))
            by_step = defaultdict(list)
            for st, t in sent:
                by_step[id(st)].append((st, t))
            text = "\n".join(_label(group[0][0], [t for _, t in group])
                             for group in by_step.values())
            ax.text(col + 0.47, d + 0.45, text, ha="center", va="center", fontsize=7)
    ax.set_xlim(0, len(keys))
    ax.set_ylim(p, 0)
    ax.set_xticks([i + 0.47 for i in range(len(keys))])
    ax.set_xticklabels([("gather " if k[0] else "reduce ") + str(k[1]) for k in keys],
                       fontsize=8, rotation=30)
    ax.set_yticks([d + 0.45 for d in range(p)])
    ax.set_yticklabels([f"device {d}" for d in range(p)], fontsize=8)
    ax.set_title(title or f"{schedule.name} over {'x'.join(map(str, schedule.shape))} devices, "
                 f"{schedule.chunk_count} chunks", fontsize=10)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    return ax


def _torus_xy(coord, shape):
    """Where chip `coord` is drawn: axis 0 down, axis 1 across, axis 2 (if any) into the page,
    up and to the right, each layer a fraction of a step behind the one before it."""
    i, j, k = (*coord, 0) if len(shape) == 2 else coord
    depth = 0.8 / max(shape[2] - 1, 1) if len(shape) == 3 else 0.0
    return j + 0.8 * depth * k, -i + 0.6 * depth * k


def draw_torus(shape, *, wrap=True, ring_axis: int = 1, bidirectional: bool = False, ax=None,
               title: str | None = None):
    """Chips of a 2D or 3D TPU slice and their ICI links, one ring highlighted; returns the Axes.

    Args:
        shape: the slice, e.g. `eq.CHIPS["v5e"].torus` (16, 16) or a v5p cube (4, 4, 4).
        wrap: whether each axis has wraparound links: one bool for all axes, or one per axis
            (on v5e/v6e only an axis of 16 chips has them; on v4/v5p an axis of whole 4-chip
            cubes). An axis without them is a line: a ring along it must come back through
            the chips it passed.
        ring_axis: the axis of the highlighted ring, through chip 0.
        bidirectional: draw the ring's two directions (the bidirectional ring) instead of one.
    """
    shape = tuple(int(n) for n in shape)
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise ValueError(f"draw_torus: a 2D or 3D shape of positive sizes, got {shape}")
    wraps = (bool(wrap),) * len(shape) if isinstance(wrap, bool) else tuple(map(bool, wrap))
    if len(wraps) != len(shape):
        raise ValueError(f"draw_torus: wrap has {len(wraps)} entries for shape {shape}")
    if not 0 <= ring_axis < len(shape):
        raise ValueError(f"draw_torus: ring_axis {ring_axis} is not an axis of {shape}")
    if ax is None:
        scale = min(1.1, 8 / max(shape[:2]))
        _, ax = plt.subplots(figsize=(shape[1] * scale + 2, shape[0] * scale + 2))
    coords = list(itertools.product(*map(range, shape)))
    xy = {c: _torus_xy(c, shape) for c in coords}
    many = len(coords) > 24  # then nodes are dots, and only the ring's chips are numbered
    for c in coords:
        for axis, n in enumerate(shape):
            if n == 1:
                continue
            nxt = list(c)
            nxt[axis] += 1
            (x0, y0) = xy[c]
            if nxt[axis] < n:
                (x1, y1) = xy[tuple(nxt)]
                ax.plot([x0, x1], [y0, y1], color="0.75", lw=0.8, zorder=1)
            elif wraps[axis] and n > 2:  # a stub out of each end stands for the wraparound
                nxt[axis] = 0
                (x1, y1) = xy[tuple(nxt)]
                dx, dy = (x0 - x1) / (n - 1), (y0 - y1) / (n - 1)
                for (x, y), sign in (((x0, y0), 1), ((x1, y1), -1)):
                    ax.plot([x, x + 0.4 * sign * dx], [y, y + 0.4 * sign * dy], color="0.6",
                            lw=0.8, ls=(0, (2, 1)), zorder=1)
    ring = [tuple(t if a == ring_axis else 0 for a in range(len(shape)))
            for t in range(shape[ring_axis])]
    closes = wraps[ring_axis] and len(ring) > 2
    forward = list(itertools.pairwise(ring)) + ([(ring[-1], ring[0])] if closes else [])
    if not closes:  # a line: the ring comes back over the same links, the other way
        forward += [(b, a) for a, b in reversed(list(itertools.pairwise(ring)))]
    ways = [forward] + ([[(b, a) for a, b in forward]] if bidirectional else [])
    two_per_link = bidirectional or not closes
    cx, cy = (sum(v) / len(xy) for v in zip(*xy.values(), strict=True))

    def outward(a, b, r):  # the arc3 bend that puts a wraparound arc outside the slice
        (x1, y1), (x2, y2) = xy[a], xy[b]
        mid = ((x1 + x2) / 2 - cx, (y1 + y2) / 2 - cy)
        return r if mid[0] * (y2 - y1) - mid[1] * (x2 - x1) >= 0 else -r

    for edges, color in zip(ways, ("C3", "C0"), strict=False):
        for a, b in edges:
            wraparound = closes and {a, b} == {ring[0], ring[-1]}
            rad = outward(a, b, 0.3 if (a, b) == (ring[-1], ring[0]) else 0.2) if wraparound \
                else 0.15 if two_per_link else 0.0
            ax.add_patch(FancyArrowPatch(xy[a], xy[b], connectionstyle=f"arc3,rad={rad}",
                                         arrowstyle="-|>", mutation_scale=8, color=color,
                                         lw=1.4, shrinkA=4, shrinkB=4, zorder=3))
    on_ring = set(ring)
    for c in coords:
        x, y = xy[c]
        big = not many or (c in on_ring and len(ring) <= 8)
        ax.scatter([x], [y], s=190 if big else 40 if c in on_ring else 12, zorder=4,
                   color="#fde2e1" if c in on_ring else "white",
                   edgecolors="C3" if c in on_ring else "0.35", linewidths=0.9)
        if big or c in (ring[0], ring[-1]):
            index = 0
            for a, n in enumerate(shape):
                index = index * n + c[a]
            ax.annotate(str(index), (x, y), ha="center", va="center", fontsize=7, zorder=5,
                        xytext=(0, 0 if big else 8), textcoords="offset points")
    ax.set_aspect("equal")
    ax.axis("off")
    ax.margins(0.1)
    wrapped = [str(a) for a, w in enumerate(wraps) if w and shape[a] > 2]
    links = f"wraparound on axis {', '.join(wrapped)}" if wrapped else "no wraparound"
    ring_kind = f"{'bidirectional ' if bidirectional else ''}ring along axis {ring_axis}" + (
        "" if closes else ": out and back over the same links")
    ax.set_title(title or f"{'x'.join(map(str, shape))} slice, {2 * len(shape)} links per chip, "
                 f"{links}\n{ring_kind}",
                 fontsize=9)
    return ax
