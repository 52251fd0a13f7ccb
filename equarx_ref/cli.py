"""equarx-ref: quantized AllReduce side by side: error, bytes on the wire, speed.

    equarx-ref demo     every algorithm x bf16, int8, int4, fp8_e4m3: bits, bytes, error, CPU time
    equarx-ref bench    quantizer throughput; --hosts N: a real multi-host run, capped links
    equarx-ref gemma    quality of quantized tensor-parallel communication on Gemma 3 270M
    equarx-ref model    modelled TPU time: speedup against message size, pipeline depth, prefill
    equarx-ref kernels  the Pallas TPU kernels: bitwise and race checks; GB/s on a real TPU
    equarx-ref outliers static int4 + bf16 outlier features (calibrated) on Gemma 3 270M
    equarx-ref sweep    the map: bits on the wire against error, every algorithm, format, remedy

(This module only parses arguments, calls the package and prints; bad arguments end with one
line naming the problem and exit status 2, before any work starts.)
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata

from ._checks import count


class _Parser(argparse.ArgumentParser):
    """argparse, but a bad argument is one line ("equarx-ref demo: error: ..."), no usage dump."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _at_least(minimum: int):
    """An argparse type: an integer >= minimum, refused with the rule in one line."""
    def parse(text: str) -> int:
        try:
            return count(int(text), "value", minimum=minimum)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}") from None
    return parse


def _argument(parse):
    """An argparse type from a parser that raises ValueError: its message, in one line."""
    def check(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return check


def _format_name(text: str) -> str:
    """A wire format as typed ("int8", "int4/b16", "bf16" for none) -> its short name."""
    from .formats import format_label, parse_format

    return format_label(parse_format(text))


def _writable(text: str) -> str:
    """An argparse type: a file path we can write (checked now, not after minutes of work)."""
    if text == "-":
        return text
    parent = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text) or not os.path.isdir(parent) or not os.access(parent, os.W_OK) or \
            (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}")
    return text


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def _write_json(path: str, obj) -> None:
    import json

    if path == "-":
        print(json.dumps(obj, indent=1))
    else:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(obj, f, indent=1)


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="run the collectives side by side (the main job)",
                       description="Every AllReduce algorithm x wire format on the same bf16 "
                       "inputs: bits per element, bytes each device sends (from the compiled "
                       "HLO), byte ratio and CPU time against the unquantized bf16 ring, and "
                       "error against the exact sum beside the theory's prediction.")
    p.add_argument("--devices", type=_at_least(2), default=8,
                   help="devices to reduce over, at least 2 (default 8)")
    p.add_argument("--size", type=_at_least(1), default=1 << 18,
                   help="values per device (default 2^18)")
    p.add_argument("--repeats", type=_at_least(1), default=5,
                   help="timed calls per configuration; the median is kept (default 5)")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write the rows as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", type=_writable, default=None,
                   help="save a figure (png, svg, pdf)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args) -> int:
    import dataclasses

    from . import devices
    from .runs import bench

    devs = devices.setup_devices(args.devices)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"{devices.describe_devices(devs)}; {args.size} bf16 values per device", file=out)
    rows = bench.compare_collectives(devs, args.size, repeats=args.repeats,
                                         progress=lambda m: print(f"  {m}", file=sys.stderr))
    cells = [[r.algorithm, r.format, f"{r.bits_per_element:g}", f"{r.bytes_sent:,}",
              f"{r.byte_ratio:.2f}x", f"{r.rel_error:.2e}",
              "-" if r.format == "bf16" else f"{r.predicted_error:.2e}",
              f"{r.max_error:.2e}", f"{r.time_ratio:.2f}", r.note] for r in rows]
    print(_table(["algorithm", "format", "bits/el", "bytes/device", "vs bf16 ring",
                  "rel err", "theory", "max err", "CPU time", "note"], cells), file=out)
    print("bytes/device: read from the compiled HLO; equal to eq.wire_bytes except rows noted "
          "'CPU: f32' (XLA:CPU runs a bf16 psum in f32: twice the bytes a TPU sends). vs bf16 "
          "ring: bf16 ring bytes / these bytes, both as sent. rel err: ||y - exact|| / ||exact||, "
          "float64 exact sum. theory: eq.predicted_relative_error (bf16 rows: no quantization, "
          "bf16 rounding only). CPU time: median wall time relative to the unquantized bf16 "
          "ring, simulated devices on this CPU (no real links: not a TPU speedup).", file=out)
    if args.json:
        _write_json(args.json, {"devices": devices.describe_devices(devs), "size": args.size,
                                "rows": [dataclasses.asdict(r) for r in rows]})
    if args.plot:
        from .viz import plot_comparison

        plot_comparison(rows, args.plot)
        print(f"figure: {args.plot}", file=out)
    return 0


def _add_bench(sub) -> None:
    from .formats import FORMAT_NAMES, UNQUANTIZED
    from .multihost import DEFAULT_ALGORITHMS, DEFAULT_FORMATS, parse_rate
    from .schedule import ALGORITHMS

    fmt_name = _argument(_format_name)
    rate = _argument(lambda text: parse_rate(text) and text)  # checked, kept as typed

    p = sub.add_parser("bench", help="quantizer throughput; with --hosts, a real multi-host run",
                       description="Without --hosts: time quantize+dequantize of a large f32 "
                       "array against the cheapest pass over the same memory (x + 1), side by "
                       "side in one run, for several formats. With --hosts N: N processes form "
                       "one JAX job (gloo over TCP) and time every algorithm x format x message "
                       "size against the bf16 ring and the time model; as root, --link caps "
                       "each host's own network namespace at that rate (else: loopback, "
                       "uncapped). CPU timings on this machine.")
    p.add_argument("--mib", type=_at_least(1), nargs="+", default=None,
                   help="sizes in MiB: of the f32 array (default 64), or with --hosts of each "
                   "host's bf16 message (default 1 2 4 8 16 32 64)")
    p.add_argument("--repeats", type=_at_least(1), default=None,
                   help="timed calls per configuration; the median is kept (default 5, "
                   "with --hosts 3)")
    p.add_argument("--hosts", type=_at_least(2), default=None,
                   help="run as this many processes (emulated hosts) of one JAX job")
    p.add_argument("--link", metavar="RATE", type=rate, default=None,
                   help="with --hosts, as root: cap each host's link, e.g. 100mbit, 1gbit")
    p.add_argument("--algorithms", nargs="+", choices=[a for a in ALGORITHMS if a != "psum"],
                   default=list(DEFAULT_ALGORITHMS),
                   help=f"with --hosts (default: {' '.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--formats", nargs="+", type=fmt_name, metavar="FMT",
                   default=list(DEFAULT_FORMATS),
                   help=f"with --hosts: {UNQUANTIZED} (unquantized), {', '.join(FORMAT_NAMES)} "
                   f"or a variant such as int4/b16 (default: {' '.join(DEFAULT_FORMATS)})")
    p.add_argument("--timeout", type=_at_least(10), default=600,
                   help="with --hosts: seconds the whole run may take (default 600)")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write the results as JSON ('-' for stdout, then the table goes to "
                   "stderr)")
    p.add_argument("--plot", metavar="PATH", type=_writable, default=None,
                   help="with --hosts: save a figure (png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args) -> int:
    if args.hosts is not None:
        return _cmd_bench_hosts(args)
    if args.link or args.plot:
        raise ValueError("--link and --plot go with --hosts")
    from .formats import Format
    from .runs import bench

    results = [bench.quantizer_throughput(f, mib=mib, repeats=args.repeats or 5)
               for mib in args.mib or [64]
               for f in (Format.int8(), Format.int4(), Format.fp8_e4m3(), Format.mxfp4())]
    out = sys.stderr if args.json == "-" else sys.stdout
    print(_table(["format", "MiB", "quantize+dequantize", "x + 1", "ratio", "GiB/s"],
                 [[r["format"], str(r["mib"]), f"{r['quantize_dequantize_s'] * 1e3:.1f} ms",
                   f"{r['elementwise_s'] * 1e3:.1f} ms", f"{r['ratio']:.2f}x",
                   f"{r['gib_per_s']:.2f}"] for r in results]), file=out)
    print("CPU timings, median of the repeats, measured side by side in this run.", file=out)
    if args.json:
        _write_json(args.json, results)
    return 0


def _cmd_bench_hosts(args) -> int:
    import shlex

    from . import multihost

    mib, repeats = args.mib or [m >> 20 for m in multihost.DEFAULT_SIZES], args.repeats or 3
    command = ["equarx-ref", "bench", "--hosts", str(args.hosts),
               *(["--link", args.link] if args.link else []), "--mib", *map(str, mib),
               "--algorithms", *args.algorithms, "--formats", *args.formats,
               "--repeats", str(repeats), *(["--json", args.json] if args.json else [])]
    try:
        result = multihost.run(args.hosts, link=args.link, sizes=[m << 20 for m in mib],
                               algorithms=args.algorithms, formats=args.formats,
                               repeats=repeats, timeout=args.timeout,
                               progress=not args.no_progress)
    except (RuntimeError, TimeoutError, KeyboardInterrupt) as e:
        print(f"equarx-ref bench: {'interrupted' if isinstance(e, KeyboardInterrupt) else e}"
              " (hosts, namespaces and links removed)", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    out = sys.stderr if args.json == "-" else sys.stdout
    c = result["chip"]
    print(f"{result['network']}; measured: link {c['link_bandwidth'] * 8 / 1e6:.0f} Mbit/s, "
          f"hop latency {c['hop_latency'] * 1e6:.0f} us, memory {c['hbm_bandwidth'] / 1e9:.2f} "
          f"GB/s per host (these make the model's Chip)", file=out)
    print(_table(["algorithm", "format", "message", "bytes/device", "seconds", "model",
                  "vs bf16 ring", "link", "compute", "plain add", "bitwise"],
                 [[r["algorithm"], r["format"], _size(r["message_bytes"]),
                   f"{r['wire_bytes_per_device']:,}", f"{r['seconds']:.4f}",
                   f"{r['predicted_seconds']:.4f}", f"{r['speedup_vs_bf16']:.2f}x",
                   f"{r['link_seconds']:.4f}", f"{r['compute_seconds']:.4f}",
                   f"{r['add_seconds']:.4f}", "yes" if r["bitwise_equal"] else "NO"]
                  for r in result["results"]]), file=out)
    print("seconds: median over repeats of the slowest host, one AllReduce, CPU processes "
          "on this machine. model: cost.predicted_time with the measured figures. link: the "
          "same sends on ready-made buffers; compute: seconds - link. bitwise: every host and "
          "one process with simulated devices agree bit for bit.", file=out)
    if args.json:
        _write_json(args.json, {"command": shlex.join(command), **result})
    if args.plot:
        multihost.plot(result, args.plot)
        print(f"figure: {args.plot}", file=out)
    return 0 if all(r["bitwise_equal"] for r in result["results"]) else 1


def _add_gemma(sub) -> None:
    from .formats import FORMAT_NAMES, UNQUANTIZED
    from .gemma.quality import DEFAULT_FORMATS
    from .schedule import ALGORITHMS

    fmt_name = _argument(_format_name)

    p = sub.add_parser("gemma", help="quality of quantized TP communication on Gemma 3 270M",
                       description="Run Gemma 3 270M (real weights, float32) tensor-parallel "
                       "with every AllReduce algorithm x wire format and compare each run with "
                       "the exact one: NLL, perplexity, dNLL with its paired standard error, KL, "
                       "top-1 agreement, and the relative error at each AllReduce site.")
    p.add_argument("--tp", type=_at_least(1), default=4,
                   help="tensor-parallel size, a divisor of the 4 query heads (default 4)")
    p.add_argument("--tokens", type=_at_least(3), default=None,
                   help="score only the first N tokens, N >= 3 (default: the whole text)")
    p.add_argument("--text", type=argparse.FileType("r", encoding="utf-8"), default=None,
                   help="a UTF-8 text file to score (default: the built-in English text)")
    p.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    p.add_argument("--formats", nargs="+", type=fmt_name, metavar="FMT",
                   default=list(DEFAULT_FORMATS),
                   help=f"wire formats: {UNQUANTIZED} (unquantized), {', '.join(FORMAT_NAMES)}, "
                   f"or a variant such as int4/b16 (default: {' '.join(DEFAULT_FORMATS)})")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write the report as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", type=_writable, default=None,
                   help="save a figure (png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_gemma)


def _cmd_gemma(args) -> int:
    from .gemma import figures, quality, report

    result = quality.evaluate_text(None if args.text is None else args.text.read(),
                                   tp=args.tp, max_tokens=args.tokens,
                                   algorithms=args.algorithms, formats=args.formats,
                                   progress=not args.no_progress)  # ValueError: one line (main)
    print(report.format_table(result), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        _write_json(args.json, result)
    if args.plot:
        figures.plot_report(result, args.plot)
    return 0


def _add_model(sub) -> None:
    from .models.cost import CHIPS
    from .schedule import ALGORITHMS

    p = sub.add_parser("model", help="modelled TPU time: speedup against message size, prefill",
                       description="The time model (equarx_ref/cost.py) on one TPU chip type: "
                       "for messages of 1 KiB to 1 GiB, the modelled time of the unquantized "
                       "AllReduce and the speedup of int8 and int4, each at its best pipeline "
                       "depth; then Gemma 3 12B and 27B prefill at the given TP. Modelled "
                       "figures, not measurements.")
    p.add_argument("--chip", choices=sorted(CHIPS), default="v5e", help="default v5e")
    p.add_argument("--devices", type=_at_least(2), default=8, help="chips in the ring (8)")
    p.add_argument("--algorithm", choices=[a for a in ALGORITHMS if a != "psum"],
                   default="bidir_ring", help="default bidir_ring")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write the rows as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", type=_writable, default=None,
                   help="save the speedup curves (png, svg, pdf)")
    p.set_defaults(func=_cmd_model)


def _cmd_model(args) -> int:
    from .formats import Format
    from .gemma.config import PRESETS
    from .models import cost
    from .models.prefill import prefill_time

    out = sys.stderr if args.json == "-" else sys.stdout
    chip, p, alg = cost.CHIPS[args.chip], args.devices, args.algorithm
    fmts = {"int8": Format.int8(), "int4": Format.int4()}

    def best(n, fmt):
        k = cost.best_num_chunks(n, p, fmt=fmt, algorithm=alg, chip=chip)
        return cost.predicted_time(n, p, fmt=fmt, algorithm=alg, chip=chip, num_chunks=k), k

    rows = []
    for log2 in range(10, 31, 2):
        n = (1 << log2) // 2  # bf16 values
        base, _ = best(n, None)
        row = {"message_bytes": 1 << log2, "bf16_seconds": base}
        for name, fmt in fmts.items():
            t, k = best(n, fmt)
            row |= {f"{name}_seconds": t, f"{name}_speedup": base / t, f"{name}_num_chunks": k}
        rows.append(row)
    print(f"{chip.name}, {p} chips, {alg}; modelled ({chip.source})", file=out)
    print(_table(["message", "bf16", "int8", "speedup", "k", "int4", "speedup", "k"],
                 [[_size(r["message_bytes"]), _us(r["bf16_seconds"]), _us(r["int8_seconds"]),
                   f"{r['int8_speedup']:.2f}x", str(r["int8_num_chunks"]),
                   _us(r["int4_seconds"]), f"{r['int4_speedup']:.2f}x",
                   str(r["int4_num_chunks"])] for r in rows]), file=out)
    crossover = {name: cost.crossover_bytes(p, fmt=fmt, algorithm=alg, chip=chip)
                 for name, fmt in fmts.items()}
    print("crossover (quantized faster from): " + ", ".join(
        f"{k} {_size(v)}" for k, v in crossover.items()) + " (the chip figures carry no fixed "
        "cost of quantizing, so only block padding loses)", file=out)
    prefill = []
    for name in ("12b", "27b"):
        base = prefill_time(PRESETS[name], 2048, p, chip=chip, fmt=None, algorithm=alg)
        int8 = prefill_time(PRESETS[name], 2048, p, chip=chip, fmt=fmts["int8"], algorithm=alg)
        prefill.append({"model": f"Gemma 3 {name.upper()}", "tokens": 2048, "tp": p,
                        "compute_s": base.compute_s, "bf16_allreduce_s": base.allreduce_s,
                        "int8_allreduce_s": int8.allreduce_s,
                        "speedup": base.total_s / int8.total_s})
    print(_table(["prefill (2048 tokens)", "matmuls", "AllReduce bf16", "int8", "speedup"],
                 [[r["model"], _us(r["compute_s"]), _us(r["bf16_allreduce_s"]),
                   _us(r["int8_allreduce_s"]), f"{r['speedup']:.2f}x"] for r in prefill]),
          file=out)
    print("matmuls at 50% of peak bf16 FLOP/s; the paper measured 1.1x (12B) and 1.25x (27B) "
          "on TPU (EQuARX, arXiv 2506.17615).", file=out)
    report = {"chip": args.chip, "devices": p, "algorithm": alg, "modelled": True,
              "rows": rows, "crossover_bytes": crossover, "prefill": prefill}
    if args.json:
        _write_json(args.json, report)
    if args.plot:
        from .viz import plot_speedup

        plot_speedup(report).figure.savefig(args.plot, dpi=120)
    return 0


def _add_kernels(sub) -> None:
    p = sub.add_parser("kernels", help="the Pallas TPU kernels: checks; GB/s on a real TPU",
                       description="The Pallas ring AllReduce (impl='pallas') against the XLA "
                       "path: bitwise equality and the race detector's count, in TPU interpret "
                       "mode on CPU devices (a deliberately broken kernel must show races). On "
                       "a TPU: the fused hop kernel's GB/s against XLA's hop and the chip's HBM "
                       "bandwidth, measured on the chip. Without a TPU, no TPU figure.")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write the report as JSON ('-' for stdout, then the text goes to stderr)")
    p.set_defaults(func=_cmd_kernels)


def _cmd_kernels(args) -> int:
    from . import devices
    from .runs import kernel_checks

    out = sys.stderr if args.json == "-" else sys.stdout
    devs = devices.setup_devices(8)
    report = kernel_checks.report(progress=lambda m: print(f"  {m}", file=sys.stderr))
    if not report["tpu"]:
        print(f"no TPU here ({devices.describe_devices(devs)}): the kernels ran in TPU "
              "interpret mode (correctness and races only, no speed)", file=out)
    rows = [[str(c["p"]), c["algorithm"], c["format"], str(c["num_chunks"]),
             c["sabotage"] or "-", "yes" if c["bitwise"] else "NO",
             "-" if c["races"] is None else str(c["races"])] for c in report["checks"]]
    print(_table(["p", "algorithm", "format", "pieces", "sabotage", "bitwise = xla", "races"],
                 rows), file=out)
    print("the fused hop lowered for a TPU (Mosaic, checked from this machine):", file=out)
    for name, status in report["lowering"].items():
        print(f"  {name:>9}: {status}", file=out)
    for t in report["timings"]:
        hbm = "" if t["hbm_gbps"] is None else f", {t['kernel_gbps'] / t['hbm_gbps']:.0%} of HBM"
        print(f"{t['chip']} fused hop {t['format']}: {t['kernel_gbps']:.0f} GB/s (XLA "
              f"{t['xla_gbps']:.0f} GB/s{hbm}), bitwise {t['bitwise']}", file=out)
    for name, error in report["timing_errors"].items():
        print(f"fused hop {name} not timed on the chip: {error}", file=out)
    if args.json:
        _write_json(args.json, report)
    return 0


def _add_outliers(sub) -> None:
    p = sub.add_parser("outliers", help="static int4 + bf16 outliers (Dong et al.) on Gemma",
                       description="Calibrate static int4 AllReduce on Gemma 3 270M (per-site, "
                       "per-device, per-feature ranges on the calibration text, E/64 widest "
                       "features in bf16), then score it beside the dynamic formats on the "
                       "evaluation text: dNLL with paired SE, KL, top-1, bits per value and "
                       "bytes on the wire (counted and read from the compiled HLO).")
    p.add_argument("--tp", type=_at_least(2), default=4, help="tensor-parallel size (4)")
    p.add_argument("--tokens", type=_at_least(3), default=None,
                   help="score only the first N tokens of the evaluation text")
    p.add_argument("--seq", type=_at_least(2), default=256,
                   help="calibration sequence length in tokens (256)")
    p.add_argument("--outliers", type=_at_least(0), default=None,
                   help="bf16 features per site (default E/64)")
    p.add_argument("--calibration", metavar="NPZ", default=None,
                   help="use this saved calibration instead of calibrating")
    p.add_argument("--save-calibration", metavar="NPZ", type=_writable, default=None,
                   help="save the calibration state (.npz)")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write the report as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_outliers)


def _cmd_outliers(args) -> int:
    import shlex

    from . import outliers
    from .gemma import calibrate, report

    state = None if args.calibration is None else outliers.load_calibration(args.calibration)
    if state is None and args.save_calibration:
        state = calibrate.calibrate_text(tp=args.tp, seq=args.seq, progress=not args.no_progress)
    if args.save_calibration:
        outliers.save_calibration(args.save_calibration, state)
    result = calibrate.evaluate_static(tp=args.tp, max_tokens=args.tokens, calibration=state,
                                       seq=args.seq, outliers=args.outliers,
                                       progress=not args.no_progress)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(report.format_table(result), file=out)
    print("\n" + calibrate.summary(result), file=out)
    if args.json:
        defaults = {"tp": 4, "seq": 256}                  # the command as typed, defaults left out
        flags = [(f"--{k.replace('_', '-')}", v) for k, v in vars(args).items()
                 if k not in ("command", "func", "no_progress") and v is not None
                 and defaults.get(k) != v]
        command = ["equarx-ref", "outliers", *(["--no-progress"] if args.no_progress else []),
                   *(str(x) for flag in flags for x in flag)]
        _write_json(args.json, {"command": shlex.join(command), **result})
    return 0


def _add_sweep(sub) -> None:
    from .formats import Format
    from .models.cost import CHIPS
    from .runs.sweep import DATA, DEFAULT_ALGORITHMS, DEFAULT_FORMATS, DEFAULT_P, REMEDIES

    fmt_name = _argument(lambda text: str(Format.parse(text)))  # quantized formats only

    p = sub.add_parser("sweep", help="the map: bits on the wire against error, and remedies",
                       description="Every device count x algorithm x wire format x remedy "
                       "(stochastic rounding, Hadamard rotation, hop-aware bits) on the same "
                       "synthetic inputs (Gaussian, and Gaussian with outlier features): bits "
                       "per element on the wire, bytes per value each device sends, relative "
                       "error against the exact sum, the Pareto front, and the modelled "
                       "speedup on one TPU chip type (cost model, not a measurement).")
    p.add_argument("--p", type=_at_least(2), nargs="+", default=list(DEFAULT_P),
                   help=f"device counts (default {' '.join(map(str, DEFAULT_P))})")
    p.add_argument("--algorithms", nargs="+", choices=list(DEFAULT_ALGORITHMS),
                   default=list(DEFAULT_ALGORITHMS))
    p.add_argument("--formats", nargs="+", type=fmt_name, metavar="FMT",
                   default=list(DEFAULT_FORMATS),
                   help=f"wire formats (default: {' '.join(DEFAULT_FORMATS)})")
    p.add_argument("--remedies", nargs="+", choices=list(REMEDIES), default=list(REMEDIES))
    p.add_argument("--data", nargs="+", choices=list(DATA), default=list(DATA))
    p.add_argument("--size", type=_at_least(1), default=1 << 14,
                   help="values per device (default 16384)")
    p.add_argument("--chip", choices=sorted(CHIPS), default="v5e",
                   help="chip of the modelled speedup (default v5e)")
    p.add_argument("--json", metavar="PATH", type=_writable, default=None,
                   help="write every point as JSON ('-' for stdout, then the tables go to "
                   "stderr)")
    p.add_argument("--plot", metavar="PATH", type=_writable, default=None,
                   help="save the map (png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_sweep)


def _cmd_sweep(args) -> int:
    import shlex

    from . import devices
    from .runs import sweep

    devs = devices.setup_devices(max(args.p))
    out = sys.stderr if args.json == "-" else sys.stdout
    command = ["equarx-ref", "sweep", "--p", *map(str, args.p), "--algorithms",
               *args.algorithms, "--formats", *args.formats, "--remedies", *args.remedies,
               "--data", *args.data, "--size", str(args.size), "--chip", args.chip,
               *(["--json", args.json] if args.json else [])]
    result = sweep.sweep(args.p, args.algorithms, args.formats, args.remedies, args.data,
                         size=args.size, chip=args.chip, progress=not args.no_progress)
    print(f"{devices.describe_devices(devs)}; {args.size} values per device; "
          f"{len(result['points'])} points in {result['seconds']:.0f} s", file=out)
    for kind in args.data:
        print(f"\n{kind}:", file=out)
        print(_table(["p", "algorithm", "format", "remedy", "bits/el", "bytes/value",
                      "rel err", "model", f"{args.chip} speedup", "front"],
                     sweep.table(result, kind)), file=out)
    print(f"\nbits/el: bytes sent over the same algorithm's unquantized bf16 bytes, x 16. "
          f"bytes/value: bytes one device sends / values in the message. rel err: against a "
          f"float64 sum. model: predict.predicted_relative_error (Gaussian; none for "
          f"stochastic rounding). speedup: modelled (cost.predicted_time, "
          f"{result['message_bytes'] >> 20} MiB bf16 message) against the unquantized "
          f"bidirectional ring; hop-aware plans are priced at their base format's bytes, "
          f"which they do not exceed. front: on the Pareto front of bytes/value and error.",
          file=out)
    if args.json:
        _write_json(args.json, {"command": shlex.join(command),
                                "devices": devices.describe_devices(devs), **result})
    if args.plot:
        from .viz import plot_sweep

        plot_sweep(result, args.plot)
        print(f"figure: {args.plot}", file=out)
    return 0


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def _us(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(prog="equarx-ref", description=__doc__.split("\n\n(")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {metadata.version('equarx-ref')}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    _add_demo(sub)
    _add_bench(sub)
    _add_gemma(sub)
    _add_model(sub)
    _add_kernels(sub)
    _add_outliers(sub)
    _add_sweep(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except (ValueError, ImportError) as e:  # bad input found by the package: one line
        print(f"equarx-ref {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
