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
speedup against message size).
"""

from __future__ import annotations

import math
from collections import defaultdict

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from .formats import UNQUANTIZED
from .schedule import Schedule

__all__ = ["MARKERS", "draw_schedule", "draw_timeline", "plot_bytes_error", "plot_comparison",
           "plot_cpu_time", "plot_speedup"]

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
                 f"{schedule.num_chunks} chunks", fontsize=10)
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
    algorithm. Lower left is better.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.8))
    colors = _colors(rows)
    for r in rows:
        ax.scatter(1 / r.byte_ratio, max(r.rel_error, 1e-8), color=colors[r.format],
                   marker=MARKERS.get(r.algorithm, "o"), s=50, alpha=0.85)
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
                  for a in dict.fromkeys(r.algorithm for r in rows)])
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
