"""`equarx-ref demo` on the site: every collective side by side, from equarx_ref/data/demo.json.

The rows are `equarx_ref.runs.demo.Row`s as the command wrote them; the figures are the
package's own (`equarx_ref.viz`), the ones `equarx-ref demo --plot` saves.
"""

from __future__ import annotations

from .commands import COMMANDS, command_block
from .common import Section, load, png, table

#: The rows of the home page's short table: (algorithm, format).
HEADLINE = [("ring", "bf16"), ("ring", "int8"), ("two_shot", "int8"), ("one_shot", "int8"),
            ("ring", "int4"), ("two_shot", "int4")]


def rows() -> tuple[dict, list]:
    """The stored demo run: its header fields, and its rows as `runs.demo.Row`s."""
    from equarx_ref.runs.demo import Row

    demo = load("demo.json")
    return demo, [Row(**r) for r in demo["rows"]]


def theory(r) -> str:
    """The predicted error, or "–" for an unquantized row (nothing quantized)."""
    return "–" if r.format == "bf16" else f"{r.predicted_error:.2%}"


def full_table(rows) -> str:
    """Every row: bits, bytes (HLO), byte ratio, error and theory, CPU time."""
    return table(
        ["algorithm", "format", "bits / value", "bytes / device (HLO)", "fewer bytes",
         "rel. error", "theory", "CPU time"],
        [[r.algorithm, r.format + (f" ({r.note})" if r.note else ""),
          f"{r.bits_per_element:g}", f"{r.bytes_sent:,}", f"{r.byte_ratio:.2f}x",
          f"{r.rel_error:.2%}", theory(r), f"{r.time_ratio:.2f}"] for r in rows])


def headline_table(rows) -> str:
    """The `HEADLINE` rows, without timings."""
    by = {(r.algorithm, r.format): r for r in rows}
    return table(
        ["algorithm", "wire format", "bytes sent per device", "fewer bytes than bf16 ring",
         "relative error", "theory"],
        [[a, f, f"{by[a, f].bytes_sent:,}", f"{by[a, f].byte_ratio:.2f}x",
          f"{by[a, f].rel_error:.2%}", theory(by[a, f])] for a, f in HEADLINE if (a, f) in by])


def setting(demo: dict) -> str:
    return (f"{demo['devices']}; {demo['size']:,} bf16 values per device, N(0, 1), the same "
            "inputs for every row.")


def results() -> Section:
    """The Results page: the command, every row, what the columns mean, both figures."""
    import matplotlib.pyplot as plt

    from equarx_ref.viz import plot_bytes_error, plot_cpu_time

    demo, rs = rows()
    path = "assets/results/demo.png"
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 8.5), height_ratios=[1, 1.1])
    plot_bytes_error(rs, ax=top)  # one above the other: each as wide as the page allows
    plot_cpu_time(rs, ax=bottom)
    fig.tight_layout()
    return Section("\n".join([
        command_block("demo.json"), "", setting(demo), "", full_table(rs), "",
        "- *bits / value*: on the wire, scales included; *bytes / device*: what one device "
        "sends, read from the compiled HLO (equal to `eq.wire_bytes`, except that XLA:CPU runs a "
        "bf16 `psum` in f32: \"CPU: f32\"); *fewer bytes*: the unquantized bf16 ring's bytes "
        "over these.",
        "- *rel. error*: $\\lVert y - \\text{exact} \\rVert / \\lVert \\text{exact} \\rVert$ "
        "against the float64 sum of the inputs; *theory*: `eq.predicted_relative_error` (bf16 "
        "rows are not quantized: their error is the bf16 rounding of the partial sums).",
        "- *CPU time*: median wall time over the unquantized bf16 ring's, on simulated "
        "devices of one CPU, with no real links: a CPU timing, not a TPU speed-up.", "",
        f"![Bytes against error, and CPU time, for every row above]({path})", "",
        "*Drawn by `eq.viz.plot_bytes_error` and `eq.viz.plot_cpu_time` (side by side, "
        "`eq.viz.plot_comparison`: the figure `equarx-ref demo --plot` saves).*", "",
    ]), {path: png(fig)})


def headline() -> Section:
    """The home page: a few rows and the bytes-against-error figure."""
    from equarx_ref.viz import plot_bytes_error

    demo, rs = rows()
    path = "assets/results/headline.png"
    return Section("\n".join([
        "## Headline numbers", "",
        f"An AllReduce of {demo['size']:,} bf16 values per device on {demo['devices']}, every "
        "algorithm on the same inputs (all rows and the CPU timings on the "
        "[Results](results.md) page):", "",
        headline_table(rs), "",
        f"![Bytes against error for every algorithm and format]({path})", "",
        f"*Generated from the output of `{COMMANDS['demo.json']}`; the figure is "
        "`eq.viz.plot_bytes_error`.*", "",
    ]), {path: png(plot_bytes_error(rs).figure)})
