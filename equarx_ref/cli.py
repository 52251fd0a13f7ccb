"""The `equarx-ref` command: thin: it parses, calls the package, prints.

    equarx-ref demo     every algorithm x format side by side: bits, bytes, error, CPU time
    equarx-ref bench    quantize+dequantize throughput against a plain elementwise pass
    equarx-ref gemma    quality of quantized tensor-parallel communication on Gemma 3 270M
"""

from __future__ import annotations

import argparse
import sys


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
    p.add_argument("--devices", type=int, default=8, help="devices (default 8)")
    p.add_argument("--size", type=int, default=1 << 18, help="values per device (default 2^18)")
    p.add_argument("--repeats", type=int, default=5, help="timed calls per configuration")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="write the rows as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", default=None, help="save a figure (png, svg, pdf)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args) -> int:
    import dataclasses

    from . import benchmark, devices

    devs = devices.setup_devices(args.devices)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"{devices.describe_devices(devs)}; {args.size} bf16 values per device", file=out)
    rows = benchmark.compare_collectives(devs, args.size, repeats=args.repeats,
                                         progress=lambda m: print(f"  {m}", file=sys.stderr))
    cells = [[r.algorithm, r.format, f"{r.bits_per_element:g}", f"{r.bytes_sent:,}",
              f"{r.byte_ratio:.2f}x", f"{r.rel_error:.2e}",
              "-" if r.format == "bf16" else f"{r.predicted_error:.2e}",
              f"{r.max_error:.2e}", f"{r.time_ratio:.2f}", r.note] for r in rows]
    print(_table(["algorithm", "format", "bits/el", "bytes/device", "vs bf16 ring",
                  "rel err", "theory", "max err", "CPU time", "note"], cells), file=out)
    print("bytes/device: read from the compiled HLO (equal to eq.wire_bytes). vs bf16 ring: "
          "bytes saved. rel err: ||y - exact|| / ||exact||, float64 exact sum. theory: "
          "eq.predicted_relative_error (bf16 rows: no quantization, bf16 rounding only). "
          "CPU time: median wall time relative to the unquantized bf16 ring, simulated devices "
          "on this CPU (no real links: not a TPU speedup).", file=out)
    if args.json:
        _write_json(args.json, {"devices": devices.describe_devices(devs), "size": args.size,
                                "rows": [dataclasses.asdict(r) for r in rows]})
    if args.plot:
        from .viz import plot_comparison

        plot_comparison(rows, args.plot)
        print(f"figure: {args.plot}", file=out)
    return 0


def _add_bench(sub) -> None:
    p = sub.add_parser("bench", help="quantize+dequantize throughput against an elementwise pass")
    p.add_argument("--mib", type=int, default=64, help="array size in MiB of f32 (default 64)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", metavar="PATH", default=None, help="write the results as JSON")
    p.set_defaults(func=_cmd_bench)


def _cmd_bench(args) -> int:
    from . import benchmark
    from .formats import Format

    results = [benchmark.quantizer_throughput(f, mib=args.mib, repeats=args.repeats)
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


def _add_gemma(sub) -> None:
    from ._checks import count
    from .collectives import ALGORITHMS
    from .formats import FORMAT_NAMES, UNQUANTIZED, format_label, parse_format
    from .gemma.quality import DEFAULT_FORMATS

    def at_least(minimum):
        def parse(text):
            try:
                return count(int(text), "it", minimum=minimum)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r}: must be an integer >= {minimum}") \
                    from None
        return parse

    def fmt_name(text):
        try:
            return format_label(parse_format(text))
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    p = sub.add_parser("gemma", help="quality of quantized TP communication on Gemma 3 270M",
                       description="Run Gemma 3 270M (real weights, float32) tensor-parallel "
                       "with every AllReduce algorithm x wire format and compare each run with "
                       "the exact one: NLL, perplexity, dNLL with its paired standard error, KL, "
                       "top-1 agreement, and the relative error at each AllReduce site.")
    p.add_argument("--tp", type=at_least(1), default=4,
                   help="tensor-parallel size, a divisor of the 4 query heads (default 4)")
    p.add_argument("--tokens", type=at_least(3), default=None,
                   help="score only the first N tokens, N >= 3 (default: the whole text)")
    p.add_argument("--text", type=argparse.FileType("r", encoding="utf-8"), default=None,
                   help="a UTF-8 text file to score (default: the built-in English text)")
    p.add_argument("--algorithms", nargs="+", choices=ALGORITHMS, default=list(ALGORITHMS))
    p.add_argument("--formats", nargs="+", type=fmt_name, metavar="FMT",
                   default=list(DEFAULT_FORMATS),
                   help=f"wire formats: {UNQUANTIZED} (unquantized), {', '.join(FORMAT_NAMES)}, "
                   f"or a variant such as int4/b16 (default: {' '.join(DEFAULT_FORMATS)})")
    p.add_argument("--json", metavar="PATH", default=None, help="write the report as JSON "
                   "('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", default=None, help="save a figure (png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_gemma)


def _cmd_gemma(args) -> int:
    import os

    from .gemma import figures, quality, report

    for path in (args.json, args.plot):             # fail now, not after minutes of work
        if path not in (None, "-") and not os.access(os.path.dirname(os.path.abspath(path)),
                                                     os.W_OK):
            print(f"equarx-ref gemma: error: cannot write {path}", file=sys.stderr)
            return 2
    try:
        result = quality.evaluate_text(None if args.text is None else args.text.read(),
                                       tp=args.tp, max_tokens=args.tokens,
                                       algorithms=args.algorithms, formats=args.formats,
                                       progress=not args.no_progress)
    except ValueError as e:                         # e.g. a TP size the model cannot split over
        print(f"equarx-ref gemma: error: {e}", file=sys.stderr)
        return 2
    print(report.format_table(result), file=sys.stderr if args.json == "-" else sys.stdout)
    if args.json:
        _write_json(args.json, result)
    if args.plot:
        figures.plot_report(result, args.plot)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="equarx-ref", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_bench(sub)
    _add_gemma(sub)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
