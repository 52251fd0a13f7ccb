"""`equarx-ref bench` on the site: the codec's cost against a plain pass, from bench.json.

bench.json holds {"device", "platform", "codec": rows, "quantizer": rows} (`runs.bench`); a file
made before the codec rows existed is the list of quantizer rows alone, shown as it was.
"""

from __future__ import annotations

from .commands import command_block
from .common import Section, load, table


def _parts(data) -> dict:
    return {"codec": [], "quantizer": data} if isinstance(data, list) else data


def bench_table(data) -> str:
    """One line per format: quantize + dequantize against `x + 1` on the same array (and,
    when stored, against int8's)."""
    rows = _parts(data)["quantizer"]
    vs_int8 = any(r.get("to_int8") is not None for r in rows)
    return table(
        ["format", "array (MiB of f32)", "quantize + dequantize", "`x + 1` on the same array",
         "ratio", *(["vs int8"] if vs_int8 else []), "GiB/s"],
        [[f"`{r['format']}`", r["mib"], f"{r['quantize_dequantize_s'] * 1e3:.1f} ms",
          f"{r['elementwise_s'] * 1e3:.1f} ms", f"{r['ratio']:.2f}x",
          *([f"{r['to_int8']:.2f}x" if r.get("to_int8") is not None else "–"] if vs_int8
            else []), f"{r['gib_per_s']:.2f}"]
         for r in rows])


def codec_table(data) -> str:
    """One line per program (encode, decode, hop) and format: GB/s over its fewest bytes and
    the fraction of the copy's; empty when the file has no codec rows."""
    rows = _parts(data)["codec"]
    if not rows:
        return ""
    return table(
        ["path", "program", "format", "MiB of bf16", "time", "fewest bytes", "GB/s", "of copy",
         "vs a + b"],
        [[r.get("path", "xla"), r["program"], f"`{r['format']}`" if r["format"] else "–",
          r["mib"],
          f"{r['seconds'] * 1e3:.2f} ms", f"{r['fewest_bytes'] / 1e6:.1f} MB",
          f"{r['gbps']:.1f}", f"{r['of_copy']:.0%}",
          f"{r['to_add']:.2f}x" if "to_add" in r else "–"] for r in rows])


def results() -> Section:
    """The Results page: the command and its tables, with what the timings are."""
    data = load("bench.json")
    parts = _parts(data)
    codec = codec_table(data)
    lines = [command_block("bench.json"), ""]
    if codec:
        lines += [f"The codec on {parts['device']} ({parts['platform']}): encode, decode and "
                  "one ring hop (decode, add a bf16 chunk, encode), each in GB/s over the "
                  "fewest bytes it must move (its inputs read once, its outputs written once) "
                  "and as a fraction of a copy's (the faster `x + 1`, on bf16 or on f32 of "
                  "the same bytes), and its time over a bf16 `a + b`'s (a plain ring hop: "
                  "the quantized hop's yardstick), timed in the same run:", "",
                  codec, "", "Quantize + dequantize of f32, against `x + 1` and int8's:", ""]
    lines += [bench_table(data), "",
              "*Timings on the machine that ran it (median of the repeats), every program and "
              "the plain pass measured side by side in the same run: the ratios are what the "
              "tables are for, the absolute times depend on the machine.*", ""]
    return Section("\n".join(lines))
