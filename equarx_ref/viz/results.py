"""Figures of results: what the commands measured and modelled, drawn from their rows or JSON.

One colour per wire format (unquantized bf16 grey) and one marker per algorithm (`MARKERS`), in
every figure, so a point means the same thing on every page.

- `equarx-ref demo` (`runs.demo.Row`): `plot_bytes_error`, error against the bytes sent, both
  relative (what quantizing buys: lower left is better); `plot_cpu_time`, CPU time against the
  unquantized ring (a CPU timing, no real links); `plot_comparison`, the two side by side.
- `equarx-ref model`: `plot_speedup`, modelled speedup over bf16 against message size.
- `equarx-ref bench --hosts`: `plot_measured`, measured seconds per AllReduce (its link part
  solid, its compute hatched) beside the model's prediction for each row: the one figure of a
  multi-host run, for the CLI (`--plot`), the docs and the course alike.
- `equarx-ref sweep`: `plot_sweep`, the map of error against bytes per value, Pareto front drawn.
- `equarx-ref outliers`: `plot_feature_ranges`, calibrated per-feature ranges
  (`gemma.calibrate.feature_ranges`, stored in equarx_ref/data/outliers.json): each site's features
  sorted widest first, over the site's median, the ones kept in bf16 marked.

Drawing only: every number drawn comes from the rows given.
"""

from __future__ import annotations

import math
import statistics

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from ..formats import UNQUANTIZED
from . import _checks as checks

__all__ = ["MARKERS", "plot_bytes_error", "plot_comparison", "plot_cpu_time",
           "plot_feature_ranges", "plot_measured", "plot_speedup", "plot_sweep"]

#: The marker of each algorithm, in every figure of the package.
MARKERS = {"psum": "s", "ring": "o", "bidir_ring": "^", "two_shot": "D", "one_shot": "v"}


def _colors(formats) -> dict[str, str]:
    """One colour per wire format, in order of appearance; unquantized bf16 grey."""
    colors: dict[str, str] = {}
    for f in formats:
        colors.setdefault(f, "0.5" if f == UNQUANTIZED else f"C{len(colors)}")
    return colors


def plot_bytes_error(rows, ax=None):
    """Error against bytes sent, one point per `runs.demo.Row`; returns the matplotlib Axes.

    x: bytes one device sent (compiled HLO) over the unquantized bf16 ring's, so 1/2 is half
    the traffic; y: relative error against the exact sum. Colour: wire format; marker:
    algorithm. Lower left is better. Algorithms that send the same bytes with the same error
    (ring and bidir_ring) would hide each other: each algorithm's markers are drawn a few
    percent apart along x (a dodge; the ticks are powers of two).
    """
    rows, ax = checks.items(rows, "rows"), checks.axes(ax, (6.4, 3.8))
    colors = _colors(r.format for r in rows)
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
    """CPU time of each `runs.demo.Row` over the unquantized bf16 ring's; returns the Axes."""
    rows, ax = checks.items(rows, "rows"), checks.axes(ax, (6.4, 3.8))
    colors = _colors(r.format for r in rows)
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
    rows, path = checks.items(rows, "rows"), checks.path(path)
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=[1.15, 1])
    plot_bytes_error(rows, ax=left)
    plot_cpu_time(rows, ax=right)
    fig.tight_layout()
    if path:
        fig.savefig(path, dpi=120)
    return fig

def plot_speedup(report: dict, ax=None):
    """Modelled speedup over the unquantized AllReduce against message size, from the JSON of
    `equarx-ref model` (one line per format). Returns the Axes."""
    checks.mapping(report, "report", ("rows", "chip", "devices", "algorithm"))
    checks.items(report["rows"], "report['rows']")
    ax = checks.axes(ax, (6.5, 4))
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
    `equarx-ref bench --hosts --json`, what `--plot` saves). A row that also has
    "link_seconds" is drawn as its link part (solid) under the rest, its compute (hatched);
    the model is a black tick on each bar. Colour: wire format (unquantized bf16 grey). Rows of
    several message sizes ("message_bytes") name their size under the bar, on a log y axis.
    """
    rows, title = checks.items(rows, "rows"), checks.title(title)
    ax = checks.axes(ax, (max(6.5, 0.6 * len(rows) + 1.5), 3.8))
    colors = _colors(r["format"] for r in rows)
    sized = len({r.get("message_bytes") for r in rows}) > 1
    for i, r in enumerate(rows):
        c = colors[r["format"]]
        link = min(r.get("link_seconds", r["seconds"]), r["seconds"])
        ax.bar(i, link, color=c, width=0.7)
        ax.bar(i, r["seconds"] - link, bottom=link, color="white", edgecolor=c, hatch="///",
               width=0.7)
        ax.plot([i - 0.42, i + 0.42], [r["predicted_seconds"]] * 2, color="k", lw=2)
    ax.set_xticks(range(len(rows)), [
        f"{r['algorithm']}\n{r['format']}" + (f"\n{r['message_bytes'] / 2**20:g} MiB" if sized
                                              else "") for r in rows], fontsize=7)
    ax.set_ylabel("seconds per AllReduce")
    if sized:  # sizes far apart: a log axis keeps the small messages' bars visible
        ax.set_yscale("log")
        ax.set_ylim(bottom=min(min(r.get("link_seconds", r["seconds"]), r["seconds"])
                               for r in rows) / 2)
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



def plot_sweep(result: dict, path: str | None = None):
    """The map of `equarx-ref sweep` (`sweep.sweep`'s result): one panel per device count and
    data set, error against bytes per value each device sends, the Pareto front as a line.

    Colour: wire format; marker: algorithm; filled: no remedy, hollow: a remedy (named next to
    the point when it lies on the front). Lower left is better. Returns the figure; saves it
    to `path` if given.
    """
    points = checks.items(checks.mapping(result, "result", ("points",))["points"],
                          "result['points']")
    path = checks.path(path)
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
    sites, ax = checks.items(sites, "sites"), checks.axes(ax, (7, 4))
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
