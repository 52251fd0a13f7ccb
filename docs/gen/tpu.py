"""XLA:TPU's own count on the site: the bytes the codec and the AllReduces touch, from
tpu-bytes.json (`runs.tpu_bytes` through `equarx-ref kernels --compile ... --bytes`), and the
chip's own static schedule, cycles against bytes, from tpu-schedule.json (`runs.tpu_schedule`
through `equarx-ref kernels --compile ... --schedule`).

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


#: What every figure of the schedule section is, said once above its tables.
SCHEDULE_LABEL = ("static schedule, libtpu compiled on a CPU machine, nothing ran on a TPU; "
                  "modelled")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:,.1f} us"


def chips_table(record: dict) -> str:
    """Each chip's clock (public peak bf16 FLOP/s over its MXUs' multiply-adds a cycle) and HBM
    bandwidth: what turns cycles and bytes into seconds."""
    return table(["chip", "clock", "HBM bandwidth", "peak bf16"],
                 [[chip, f"{c['clock_hz'] / 1e9:.2f} GHz", f"{c['hbm_bandwidth'] / 1e9:,.0f} GB/s",
                   f"{c['peak_flops'] / 1e12:.0f} TFLOP/s"] for chip, c in record["chips"].items()])


def yardstick_table(record: dict) -> str:
    """One line per topology and yardstick: cycles, their time, the reference and the ratio,
    and for a Pallas kernel its bundles a grid step and its loop's turns."""
    return table(["topology", "program", "static cycles", "static time", "reference", "ratio",
                  "bundles a grid step x turns"],
                 [[r["topology"], r["program"], f"{r['cycles']:,}", _us(r["compute_s"]),
                   _us(r["reference_s"]), f"{r['ratio']:.2f}x",
                   f"{r['body']:,} x {r['steps']}" if "body" in r else "-"]
                  for r in record["yardsticks"]])


def codec_schedule_table(record: dict) -> str:
    """One line per topology and format: each kernel's static compute over the HBM time of its
    fewest bytes (at most 1: the kernel is bound by memory)."""
    kernels = list(dict.fromkeys(r["kernel"] for r in record["codec"]))
    cells: dict[tuple[str, str], dict[str, float]] = {}
    for r in record["codec"]:
        cells.setdefault((r["topology"], r["format"]), {})[r["kernel"]] = r["ratio"]
    return table(["topology", "format", *kernels],
                 [[t, f"`{f}`", *(f"{by[k]:.2f}x" if k in by else "-" for k in kernels)]
                  for (t, f), by in cells.items()])


def all_reduce_schedule_table(record: dict) -> str:
    """One line per AllReduce read back whole: its static compute, the sum of its ops'
    rooflines, the time model's time, the model re-priced with the cycles, and the speedup
    over psum so re-priced."""
    rows = []
    for r in record["all_reduce"]:
        speed = (r.get("speedup_over_psum") or {}).get("cycles")
        rows.append([r["topology"], r["algorithm"], f"`{r['format']}`", r["num_chunks"],
                     r["impl"], _us(r["compute_s"]), _us(r["priced_s"]),
                     _us(r["seconds"]["model"]), _us(r["seconds"]["cycles"]),
                     f"{speed:.2f}x" if speed else "-"])
    return table(["topology", "algorithm", "format", "k", "impl", "static compute",
                  "ops' rooflines", "model", "model re-priced", "over psum"], rows)


def schedule_results() -> Section:
    stored = load("tpu-schedule.json")
    record = stored["schedule"]
    scale = record["all_reduce"][0] if record.get("all_reduce") else None
    at_scale = (f"{scale['n'] * 2 / 2**20:g} MiB of bf16 per chip, p = {scale['p']}"
                if scale else "")
    return Section(
        f"{command_block('tpu-schedule.json')}\n\n"
        f"libtpu {record['libtpu']} (jax {record['jax']}): {SCHEDULE_LABEL}. Every kernel's and "
        "fusion's cycles are read off libtpu's final bundle listings (`models/bundles.py`: "
        "bundles times loop turns) and priced at the chip's clock; memory is the fewest bytes "
        "at the chip's HBM bandwidth, and a kernel costs the larger of the two "
        "(`runs/tpu_schedule.py`):\n\n"
        f"{chips_table(record)}\n\n"
        "Yardsticks first: XLA's matmul against the chip's peak FLOP/s, a Pallas and XLA's own "
        "`x + 1` against their HBM time, and one naive int8 encoder written as a Pallas kernel "
        "twice, into the old wire's interleaved rows `u8[blocks, 34]` and into the wire's two "
        "lane-dense operands (`tpu_schedule.naive_rows34`, `naive_two_operands`: the same "
        "arithmetic over the same bytes, only the layout differs):\n\n"
        f"{yardstick_table(record)}\n\n"
        f"The Mosaic codec's kernels at {record['n'] * 2 / 2**20:g} MiB of bf16 (two-shot's "
        "reduce: 8 messages of 1/8 of it), static compute over the HBM time of the fewest bytes "
        "(at most 1x: bound by memory). The time model prices each pass of these kernels at the "
        "larger of the two on v5e and v6e (`Chip.codec_price`):\n\n"
        f"{codec_schedule_table(record)}\n\n"
        f"The AllReduces read back whole ({at_scale}): static compute, the sum of the ops' "
        "rooflines, the time model's time, the model re-priced with every kernel's and "
        "fusion's cycles, and the speedup over `lax.psum` so re-priced, all modelled:\n\n"
        f"{all_reduce_schedule_table(record)}\n")
