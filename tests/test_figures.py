"""Figures of `equarx_ref.viz` that the notebooks and the docs draw from stored results."""

from __future__ import annotations

import types

import matplotlib
import matplotlib.pyplot as plt

from equarx_ref import viz

matplotlib.use("Agg")  # before the first figure: no display needed

ROWS = [  # the shape of `equarx-ref bench --hosts --json` rows
    {"algorithm": "ring", "format": "bf16", "seconds": 4.0, "predicted_seconds": 3.5,
     "link_seconds": 3.6},
    {"algorithm": "ring", "format": "int8", "seconds": 2.0, "predicted_seconds": 2.2,
     "link_seconds": 2.5},  # link timed above the whole: drawn as all link, no compute
    {"algorithm": "two_shot", "format": "int4", "seconds": 1.0, "predicted_seconds": 0.9},
]


def test_plot_measured_stacks_link_and_compute_under_the_model(tmp_path):
    ax = viz.plot_measured(ROWS, title="4 hosts")
    ax.figure.savefig(tmp_path / "m.png")
    bars = ax.patches[:2 * len(ROWS)]  # per row: link bar, then compute bar on top of it
    for r, (link, rest) in zip(ROWS, zip(bars[::2], bars[1::2], strict=True), strict=True):
        assert abs(link.get_height() + rest.get_height() - r["seconds"]) < 1e-12, r
        assert abs(rest.get_y() - link.get_height()) < 1e-12
        assert rest.get_height() >= 0
    ticks = [line.get_ydata()[0] for line in ax.lines]
    assert ticks == [r["predicted_seconds"] for r in ROWS]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"{r['algorithm']}\n{r['format']}" for r in ROWS]
    assert ax.get_title() == "4 hosts"
    colours = {r["format"]: bar.get_facecolor() for r, bar in zip(ROWS, bars[::2], strict=True)}
    assert len(set(colours.values())) == 3  # one colour per wire format


def test_plot_measured_names_sizes_on_a_log_axis_when_a_run_has_several():
    """`bench --hosts --mib 1 32 --plot`: the one multi-host figure, with every size's rows."""
    rows = [dict(r, message_bytes=mib << 20, seconds=r["seconds"] * mib,
                 predicted_seconds=r["predicted_seconds"] * mib,
                 **({"link_seconds": r["link_seconds"] * mib} if "link_seconds" in r else {}))
            for mib in (1, 32) for r in ROWS]
    ax = viz.plot_measured(rows)
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        f"{r['algorithm']}\n{r['format']}\n{r['message_bytes'] >> 20} MiB" for r in rows]
    assert ax.get_yscale() == "log"
    assert ax.get_ylim()[0] < min(min(r.get("link_seconds", r["seconds"]), r["seconds"])
                                  for r in rows)  # every link bar shows
    single = viz.plot_measured([dict(r, message_bytes=32 << 20) for r in ROWS])
    assert single.get_yscale() == "linear" and "MiB" not in single.get_xticklabels()[0].get_text()


def test_bytes_error_plot_keeps_ring_and_bidir_ring_apart():
    """Same bytes, same error: without the dodge bidir_ring's markers would sit under ring's."""
    rows = [types.SimpleNamespace(algorithm=a, format=f, byte_ratio=b, rel_error=e)
            for f, b, e in (("bf16", 1.0, 1e-3), ("int8", 16 / 8.5, 4e-3))
            for a in ("ring", "bidir_ring")]
    ax = viz.plot_bytes_error(rows)
    points = [tuple(c.get_offsets()[0]) for c in ax.collections]
    assert len(set(points)) == len(rows), points
    for i in (0, 2):  # each pair: the same error, x within 10%
        (x1, y1), (x2, y2) = points[i], points[i + 1]
        assert y1 == y2 and x1 != x2 and abs(x1 / x2 - 1) < 0.1
    plt.close(ax.figure)
