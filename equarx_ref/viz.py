"""Figures shared by the notebooks, the docs and the command line (matplotlib only).

`draw_schedule` draws a `Schedule` as a table: one row per device, one column per time step,
each cell naming what that device sends then ("c3 -> 1": its copy of chunk 3 to device 1),
coloured by chunk, reduce steps first, then the all-gather. `plot_comparison` draws the
`equarx-ref demo` rows: error against bytes, and CPU time against the unquantized ring.
"""

from __future__ import annotations

from collections import defaultdict

import matplotlib.pyplot as plt

from .schedule import Schedule

__all__ = ["draw_schedule", "plot_comparison"]


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


def plot_comparison(rows, path: str | None = None):
    """Error against bytes sent, and CPU time, for `benchmark.compare_collectives` rows."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
    markers = {"psum": "s", "ring": "o", "bidir_ring": "^", "two_shot": "D", "one_shot": "v"}
    colors = {}
    for r in rows:
        color = colors.setdefault(r.format, f"C{len(colors)}")
        left.scatter(r.bytes_model / 2**20, max(r.rel_error, 1e-8), color=color,
                     marker=markers.get(r.algorithm, "o"), s=50,
                     label=f"{r.algorithm} {r.format}")
    left.set_xlabel("MiB sent per device (eq.wire_bytes)")
    left.set_ylabel("relative error vs exact sum")
    left.set_yscale("log")
    left.set_title("bytes against error")
    left.legend(fontsize=6, ncol=2)
    names = [f"{r.algorithm}\n{r.format}" for r in rows]
    right.bar(range(len(rows)), [r.time_ratio for r in rows],
              color=[colors[r.format] for r in rows])
    right.axhline(1.0, color="k", lw=0.8)
    right.set_xticks(range(len(rows)))
    right.set_xticklabels(names, fontsize=6, rotation=90)
    right.set_ylabel("CPU time / unquantized bf16 ring")
    right.set_title("CPU timing (simulated devices, no real links)")
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig
