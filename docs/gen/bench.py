"""`equarx-ref bench` on the site: the quantizer's cost against a plain pass, from bench.json."""

from __future__ import annotations

from .commands import command_block
from .common import Section, load, table


def bench_table(rows: list[dict]) -> str:
    """One line per format: quantize + dequantize against `x + 1` on the same array."""
    return table(
        ["format", "array (MiB of f32)", "quantize + dequantize", "`x + 1` on the same array",
         "ratio", "GiB/s"],
        [[f"`{r['format']}`", r["mib"], f"{r['quantize_dequantize_s'] * 1e3:.1f} ms",
          f"{r['elementwise_s'] * 1e3:.1f} ms", f"{r['ratio']:.2f}x", f"{r['gib_per_s']:.2f}"]
         for r in rows])


def results() -> Section:
    """The Results page: the command and its table, with what the timings are."""
    return Section("\n".join([
        command_block("bench.json"), "", bench_table(load("bench.json")), "",
        "*CPU timings (median of the repeats), the quantizer and a plain elementwise pass "
        "measured side by side in the same run: the ratio is what the table is for, the "
        "absolute times depend on the machine that ran it.*", ""]))
