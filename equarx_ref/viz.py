"""Figures shared by the notebooks, the docs and the command line (matplotlib only).

`draw_schedule` draws a `Schedule` as a table: one row per device, one column per time step,
each cell naming what that device sends then ("c3 -> 1": its copy of chunk 3 to device 1),
coloured by chunk, reduce steps first, then the all-gather.

The `equarx-ref demo` rows (`benchmark.Row`) are drawn by `plot_bytes_error` (error against the
bytes sent, both relative: what quantizing buys) and `plot_cpu_time` (CPU time against the
unquantized ring); `plot_comparison` puts the two side by side for `equarx-ref demo --plot`.
One colour per wire format and one marker per algorithm (`MARKERS`), in every figure.

`draw_timeline` draws `cost.timeline` as a Gantt chart (the pipeline of one device: compute
and link bars per piece and hop); `plot_speedup` draws `equarx-ref model` rows (modelled
speedup against message size); `plot_measured` draws measured times (the `equarx-ref bench
--hosts` rows: link and compute stacked) beside the model's prediction for each.

`kernel_timeline` turns the Pallas ring kernel's plan (`kernels.plan_ring(...).program(d)`:
which message each step waits for, which slots it reads and writes) into a timeline under
assumed durations, and `draw_kernel_timeline` draws it: the local fetches of x (HBM -> VMEM),
the compute, the link, and which message occupies each send and receive slot when: the double
buffer, drawn. Modelled, not measured: every device runs the same program, so the message a
device awaits leaves its upstream neighbour exactly when its own message of that index leaves.

`plot_sweep` draws the map of `equarx-ref sweep`; `plot_feature_ranges` draws calibrated
per-feature ranges (`gemma.calibrate.feature_ranges`, stored in equarx_ref/data/outliers.json): each
site's features sorted widest first, over the site's median, the ones kept in bf16 marked.

`draw_torus` draws a TPU slice as its ICI network: chips as nodes, numbered as a mesh of that
shape numbers its devices (row-major), links between neighbours, wraparound links as short
stubs at the edges, and one ring (the chips along one axis through chip 0) in colour, with
its wraparound as an arc and its direction(s) as arrows. 2D (v5e, v6e) and 3D (v4, v5p)
shapes; a 3D slice is drawn in an oblique projection, one layer per index of the last axis.
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D
from matplotlib.patches import FancyArrowPatch

from .formats import UNQUANTIZED
from .schedule import Schedule

__all__ = ["MARKERS", "draw_kernel_timeline", "draw_schedule", "draw_timeline", "draw_torus",
           "kernel_timeline", "plot_bytes_error", "plot_comparison", "plot_cpu_time",
           "plot_feature_ranges", "plot_measured", "plot_speedup", "plot_sweep"]

#: The marker of each algorithm, in every figure of the package.
MARKERS = {"psum": "s", "ring": "o", "bidir_ring": "^", "two_shot": "D", "one_shot": "v"}


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


def _colors(rows) -> dict[str, str]:
    """One colour per wire format, in order of appearance; unquantized bf16 grey."""
    colors: dict[str, str] = {}
    for r in rows:
        colors.setdefault(r.format, "0.5" if r.format == UNQUANTIZED else f"C{len(colors)}")
    return colors


def plot_bytes_error(rows, ax=None):
    """Error against bytes sent, one point per `benchmark.Row`; returns the matplotlib Axes.

    x: bytes one device sent (compiled HLO) over the unquantized bf16 ring's, so 1/2 is half
    the traffic; y: relative error against the exact sum. Colour: wire format; marker:
    algorithm. Lower left is better. Algorithms that send the same bytes with the same error
    (ring and bidir_ring) would hide each other: each algorithm's markers are drawn a few
    percent apart along x (a dodge; the ticks are powers of two).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.8))
    colors = _colors(rows)
    algorithms = list(dict.fromkeys(r.algorithm for r in rows))
    dodge = {a: 2 ** (0.06 * (i - (len(algorithms) - 1) / 2)) for i, a in enumerate(algorithms)}
    for r in rows:
        ax.scatter(dodge[r.algorithm] / r.byte_ratio, max(r.rel_error, 1e-8),
                   color=colors[r.format], marker=MARKERS.get(r.algorithm, "o"), s=50,
                   alpha=0.85)
    ax.set_xscale("log", base=2)
    lo, hi = (f(1 / r.byte_ratio for r in rows) for f in (min, max))
    ticks = [2.0**k for k in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]
    ax.set_xticks(ticks, [f"1/{round(1 / t)}" if t < 1 else f"{t:g}" for t in ticks])
    ax.set_yscale("log")
    ax.set_xlabel("bytes sent per device / unquantized bf16 ring")
    ax.set_ylabel("relative error vs exact sum")
    ax.set_title("bytes against error (lower left is better)")
    key = lambda **kw: Line2D([], [], ls="", ms=7, **kw)  # noqa: E731
    handles = ([key(marker="o", color=c, label=f) for f, c in colors.items()]
               + [key(marker=MARKERS.get(a, "o"), color="k", mfc="none", label=a)
                  for a in algorithms])
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    return ax


def plot_cpu_time(rows, ax=None):
    """CPU time of each `benchmark.Row` over the unquantized bf16 ring's; returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.8))
    colors = _colors(rows)
    ax.bar(range(len(rows)), [r.time_ratio for r in rows],
           color=[colors[r.format] for r in rows])
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xticks(range(len(rows)), [f"{r.algorithm}\n{r.format}" for r in rows], fontsize=6,
                  rotation=90)
    ax.set_ylabel("CPU time / unquantized bf16 ring")
    ax.set_title("CPU timing (simulated devices, no real links)")
    return ax


def plot_comparison(rows, path: str | None = None):
    """`plot_bytes_error` and `plot_cpu_time` side by side (`equarx-ref demo --plot`).

    Returns the figure; saves it to `path` if given.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=[1.15, 1])
    plot_bytes_error(rows, ax=left)
    plot_cpu_time(rows, ax=right)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig


def draw_timeline(events, ax=None, title: str | None = None):
    """A Gantt chart of `cost.timeline` events: one row for compute, one for the link; each
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


def draw_kernel_timeline(plan, ax=None, title: str | None = None, **durations):
    """Draw `kernel_timeline(plan, **durations)` as a Gantt chart, one row per resource, bars
    coloured by piece; a dashed line where the owner encodes the full sum (the all-gather
    begins). Returns the Axes."""
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


def plot_speedup(report: dict, ax=None):
    """Modelled speedup over the unquantized AllReduce against message size, from the JSON of
    `equarx-ref model` (one line per format). Returns the Axes."""
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 4))
    sizes = [r["message_bytes"] for r in report["rows"]]
    for i, name in enumerate(("int8", "int4")):
        ax.plot(sizes, [r[f"{name}_speedup"] for r in report["rows"]], marker="o",
                color=f"C{i + 1}", label=name)
    ax.axhline(1.0, color="k", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message (bytes of bf16)")
    ax.set_ylabel("speedup over bf16 (modelled)")
    ax.set_title(f"{report['chip']}, {report['devices']} chips, {report['algorithm']}: "
                 "modelled", fontsize=10)
    ax.legend()
    return ax


def plot_measured(rows, ax=None, title: str | None = None):
    """Measured seconds against the model's, one bar per row; returns the Axes.

    `rows`: dicts with "algorithm", "format", "seconds" and "predicted_seconds" (the rows of
    `equarx-ref bench --hosts --json`). A row that also has "link_seconds" is drawn as its link
    part (solid) under the rest, its compute (hatched); the model is a black tick on each bar.
    Colour: wire format (unquantized bf16 grey).
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.5, 3.8))
    colors: dict[str, str] = {}
    for r in rows:
        colors.setdefault(r["format"], "0.5" if r["format"] == UNQUANTIZED
                          else f"C{len(colors)}")
    for i, r in enumerate(rows):
        c = colors[r["format"]]
        link = min(r.get("link_seconds", r["seconds"]), r["seconds"])
        ax.bar(i, link, color=c, width=0.7)
        ax.bar(i, r["seconds"] - link, bottom=link, color="white", edgecolor=c, hatch="///",
               width=0.7)
        ax.plot([i - 0.42, i + 0.42], [r["predicted_seconds"]] * 2, color="k", lw=2)
    ax.set_xticks(range(len(rows)), [f"{r['algorithm']}\n{r['format']}" for r in rows],
                  fontsize=7)
    ax.set_ylabel("seconds per AllReduce")
    handles = [plt.Rectangle((0, 0), 1, 1, color="0.3", label="measured: link"),
               plt.Rectangle((0, 0), 1, 1, fc="white", ec="0.3", hatch="///",
                             label="measured: compute"),
               Line2D([], [], color="k", lw=2, label="model")]
    ax.legend(handles=handles, fontsize=7, ncols=3, frameon=False, loc="lower center",
              bbox_to_anchor=(0.5, 1.0))  # above the bars, under the title
    if title:
        ax.set_title(title, fontsize=10, pad=22)
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


def plot_sweep(result: dict, path: str | None = None):
    """The map of `equarx-ref sweep` (`sweep.sweep`'s result): one panel per device count and
    data set, error against bytes per value each device sends, the Pareto front as a line.

    Colour: wire format; marker: algorithm; filled: no remedy, hollow: a remedy (named next to
    the point when it lies on the front). Lower left is better. Returns the figure; saves it
    to `path` if given.
    """
    points = result["points"]
    ps = sorted({q["p"] for q in points})
    data = list(dict.fromkeys(q["data"] for q in points))
    fig, axes = plt.subplots(len(data), len(ps), figsize=(3.4 * len(ps) + 2, 3.1 * len(data)),
                             squeeze=False, sharey="row")
    colors: dict[str, str] = {}
    for q in points:
        colors.setdefault(q["format"], f"C{len(colors) % 10}")
    for row, kind in zip(axes, data, strict=True):
        for ax, p in zip(row, ps, strict=True):
            here = [q for q in points if q["p"] == p and q["data"] == kind]
            for q in here:
                plain = q["remedy"] == "none"
                ax.scatter(q["bytes_per_value"], max(q["rel_error"], 1e-8),
                           marker=MARKERS.get(q["algorithm"], "o"), s=28, alpha=0.85,
                           color=colors[q["format"]] if plain else "none",
                           edgecolors=colors[q["format"]], linewidths=1.0)
                if q["pareto"] and not plain:
                    ax.annotate(q["remedy"], (q["bytes_per_value"], q["rel_error"]),
                                fontsize=6, xytext=(3, 3), textcoords="offset points")
            front = sorted((q["bytes_per_value"], q["rel_error"]) for q in here if q["pareto"])
            if front:
                ax.step(*zip(*front, strict=True), where="post", color="k", lw=0.8, alpha=0.6)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"p = {p}, {kind}", fontsize=9)
            ax.set_xlabel("bytes sent per device / values", fontsize=8)
        row[0].set_ylabel("relative error", fontsize=8)
    key = lambda **kw: Line2D([], [], ls="", ms=6, **kw)  # noqa: E731
    handles = ([key(marker="o", color=c, label=f) for f, c in colors.items()]
               + [key(marker=MARKERS.get(a, "o"), color="k", mfc="none", label=a)
                  for a in dict.fromkeys(q["algorithm"] for q in points)]
               + [key(marker="o", color="0.4", mfc="none", label="with a remedy")])
    fig.legend(handles=handles, fontsize=7, loc="center right")
    fig.tight_layout(rect=(0, 0, 1 - 1.6 / fig.get_figwidth(), 1))
    if path:
        fig.savefig(path, dpi=110)
    return fig


def plot_feature_ranges(sites, ax=None):
    """Per-feature ranges at some AllReduce sites: how much wider the widest features are.

    `sites`: dicts with `range` (one value per feature, e.g. the calibrated max - min summed over
    devices), optional `outliers` (feature indices to mark) and a name: `label`, or `layer`
    and `kind` (the dicts of `gemma.calibrate.feature_ranges`). Each site is one line: its
    features sorted widest first (x, log scale), range over the site's median range (y, log
    scale); marked features are dots on their line. Returns the matplotlib Axes.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 4))
    for i, site in enumerate(sites):
        spread = [float(v) for v in site["range"]]
        if not spread:
            raise ValueError(f"site {i} has no feature ranges")
        median = statistics.median(spread)
        if median <= 0:
            raise ValueError(f"site {i}: its median range is {median}, not positive")
        order = sorted(range(len(spread)), key=lambda j: -spread[j])
        ratio = [spread[j] / median for j in order]
        name = site.get("label") or f"layer {site['layer']} {site['kind']}"
        (line,) = ax.plot(range(1, len(ratio) + 1), ratio, lw=1.2,
                          label=f"{name} (widest {ratio[0]:.1f}x)")
        marked = set(site.get("outliers") or ())
        ranks = [r for r, j in enumerate(order, 1) if j in marked]
        ax.plot(ranks, [ratio[r - 1] for r in ranks], "o", ms=4, color=line.get_color())
    ax.axhline(1.0, color="0.5", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("features, widest first (rank)")
    ax.set_ylabel("range / median feature's range")
    ax.legend(fontsize=8, title="dots: kept in bf16", title_fontsize=8)
    return ax
