"""XLA:TPU's own count on the site: the bytes the codec and the AllReduces touch, from
tpu-bytes.json (`runs.tpu_bytes` through `equarx-ref kernels --compile ... --bytes`).

libtpu compiled these programs on a CPU machine; nothing ran on a TPU. Each ratio is
`cost_analysis()["bytes accessed"]` over the fewest bytes the program must move (codec), or over
`lax.psum`'s bytes accessed for the same array (AllReduce). A Pallas kernel's program (path
"pallas") is counted as XLA's ops around it plus what the kernel's grid moves
(`hlo_memory.kernel_io`): XLA:TPU cannot see inside a kernel.
"""

from __future__ import annotations

from .commands import command_block
from .common import Section, load, table


def codec_table(report: dict) -> str:
    """One line per topology, format, path and program (`x + 1`, the naive yardsticks,
    encode, decode and hop) over its fewest bytes, with the part that reaches HBM and the
    tiles' padding (`hlo_memory.memory_traffic`)."""
    cells: dict[tuple[str, str, str], dict[str, dict]] = {}
    for r in report["codec"]:
        cells.setdefault((r["topology"], r["format"], r.get("path", "xla")), {})[
            r["program"]] = r
    rows = []
    for (topology, fmt, path), by in cells.items():
        for program, r in by.items():
            hbm = r["traffic"]["hbm"] + r.get("kernel_io", 0.0)
            rows.append([topology, "`x + 1` (bf16)" if program == "x + 1" else f"`{fmt}`",
                         path, program, f"{r['ratio']:.1f}x", f"{hbm / r['fewest_bytes']:.1f}x",
                         f"{r['traffic']['padding']:.2f}x"])
    return table(["topology", "format", "path", "program", "bytes accessed / fewest",
                  "of which HBM / fewest", "tile padding (XLA ops)"], rows)


def all_reduce_table(report: dict) -> str:
    """One line per topology, format and path: each algorithm's bytes accessed over psum's."""
    algorithms = list(dict.fromkeys(r["algorithm"] for r in report["all_reduce"]
                                    if r["algorithm"] != "psum"))
    cells: dict[tuple[str, str, str], dict[str, float]] = {}
    for r in report["all_reduce"]:
        if r["algorithm"] != "psum":
            key = (r["topology"], r["format"], r.get("path", "xla"))
            cells.setdefault(key, {})[r["algorithm"]] = r["to_psum"]
    return table(["topology", "format", "path", *algorithms],
                 [[t, f"`{f}`", path, *(f"{by[a]:.2f}x" for a in algorithms)]
                  for (t, f, path), by in cells.items()])


def results() -> Section:
    stored = load("tpu-bytes.json")
    report = stored["bytes"]
    return Section(
        f"{command_block('tpu-bytes.json')}\n\nlibtpu {stored['libtpu']} (jax {stored['jax']}), "
        f"compiled on a CPU machine, nothing run on a TPU; {report['mib']:g} MiB of bf16 "
        "(per chip for the AllReduces, "
        f"p = {report['p']}). The codec's programs over the fewest bytes each must move (each "
        "input read once, each output written once); the project's target is "
        f"{report['target']:g}x or less. `naive` and `naive rows` are yardsticks, not the "
        "codec: the naive int8 quantizer (absmax / 127, round; no exactness rule, codes and "
        "scales as two outputs) on the flat chunk and on rows of 1024 values "
        f"(`tpu_bytes.naive_programs`):\n\n{codec_table(report)}\n\n"
        "The AllReduces over `lax.psum`'s bytes accessed, path xla (`impl=\"xla\"`) and pallas "
        "(`impl=\"mosaic\"`: the same collectives, every message coded by the Mosaic codec's "
        "kernels); the project's target is "
        f"{report.get('all_reduce_target', report['target']):g}x or less:\n\n"
        f"{all_reduce_table(report)}\n")
