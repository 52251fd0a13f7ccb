"""The commands that run the collectives: `demo` (every algorithm x format side by side),
`bench` (codec throughput; with `--hosts`, a real multi-host run) and `sweep` (the map of
bits on the wire against error). Each parses, calls one function of `equarx_ref.runs` or
`equarx_ref.multihost`, prints.
"""

from __future__ import annotations

import sys

from . import COMMANDS
from .options import (
    argument,
    at_least,
    bytes_text,
    figure_path,
    format_name,
    save_figure,
    table,
    writable,
    write_json,
)

TIMEOUT_S = 600  # --timeout's default: a run's record names --timeout only when it differs


def add_demo(sub) -> None:
    from ..devices import MAX_SIMULATED_DEVICES
    from ..formats import COMPARED_FORMATS, FORMAT_NAMES, UNQUANTIZED
    from ..schedule import ALGORITHMS

    p = sub.add_parser("demo", help=COMMANDS["demo"][0],
                       description="Every AllReduce algorithm x wire format on the same bf16 "
                       "inputs: bits per element, bytes each device sends (from the compiled "
                       "HLO), byte ratio and CPU time against the unquantized bf16 ring, and "
                       "error against the exact sum beside the theory's prediction. A row the "
                       "size gate sent unquantized says so.")
    p.add_argument("--devices", type=at_least(2), default=8,
                   help=f"devices to reduce over, at least 2 (default 8; simulated: at most "
                   f"{MAX_SIMULATED_DEVICES})")
    p.add_argument("--size", type=at_least(1), default=1 << 18,
                   help="values per device (default 2^18)")
    p.add_argument("--algorithms", nargs="+", choices=list(ALGORITHMS), default=None,
                   help="default: all (the unquantized bf16 ring, every ratio's baseline, "
                   "always runs)")
    p.add_argument("--formats", nargs="+", type=argument(format_name), metavar="FMT",
                   default=None,
                   help=f"{UNQUANTIZED} (unquantized), {', '.join(FORMAT_NAMES)} or a variant "
                   f"such as int4/b16 (default: {' '.join(COMPARED_FORMATS)})")
    p.add_argument("--repeats", type=at_least(1), default=5,
                   help="timed calls per configuration; the median is kept (default 5)")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the rows as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", type=figure_path, default=None,
                   help="save a figure (png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_demo)


def demo_cells(r) -> list[str]:
    """A demo row as the table prints it: a row the size gate sent unquantized names the
    format it sent wherever a format would be claimed (format, bits/el, theory, note)."""
    from ..formats import UNQUANTIZED

    quantized = r.format != UNQUANTIZED and not r.gated
    return [r.algorithm, f"{r.format} (as {UNQUANTIZED})" if r.gated else r.format,
            f"{r.bits_per_element:g}", f"{r.bytes_sent:,}", f"{r.byte_ratio:.2f}x",
            f"{r.rel_error:.2e}", f"{r.predicted_error:.2e}" if quantized else "-",
            f"{r.max_error:.2e}", f"{r.time_ratio:.2f}", r.note]


def cmd_demo(args) -> int:
    import dataclasses

    from ..runs.demo import demo

    out = sys.stderr if args.json == "-" else sys.stdout
    report = demo(args.devices, args.size, repeats=args.repeats, formats=args.formats,
                  algorithms=args.algorithms,
                  progress=None if args.no_progress else lambda m: print(f"  {m}",
                                                                         file=sys.stderr))
    rows = report["rows"]
    print(f"{report['devices']}; {args.size} bf16 values per device", file=out)
    print(table(["algorithm", "format", "bits/el", "bytes/device", "vs bf16 ring",
                 "rel err", "theory", "max err", "CPU time", "note"],
                [demo_cells(r) for r in rows]), file=out)
    print("bytes/device: read from the compiled HLO; equal to eq.wire_bytes except rows noted "
          "'CPU: f32' (XLA:CPU runs a bf16 psum in f32: twice the bytes a TPU sends). vs bf16 "
          "ring: bf16 ring bytes / these bytes, both as sent. rel err: ||y - exact|| / ||exact||, "
          "float64 exact sum. theory: eq.predicted_relative_error (bf16 rows: no quantization, "
          "bf16 rounding only). CPU time: median wall time relative to the unquantized bf16 "
          "ring, simulated devices on this CPU (no real links: not a TPU speedup).", file=out)
    if any(r.gated for r in rows):
        print("(as bf16), 'sent bf16: size gate': all_reduce's default size gate "
              "(min_bytes=None) sent these rows unquantized, because quantized they would "
              "send no fewer bytes (a message this short is padded to whole blocks); their "
              "bits, bytes and error are bf16's. all_reduce(..., min_bytes=0) always "
              "quantizes.", file=out)
    if args.json:
        write_json(args.json, {"devices": report["devices"], "size": args.size,
                                "rows": [dataclasses.asdict(r) for r in rows]})
    if args.plot:
        from ..viz import plot_comparison

        save_figure(plot_comparison(rows), args.plot, out)
    return 0



def add_bench(sub) -> None:
    from ..formats import FORMAT_NAMES, UNQUANTIZED
    from ..multihost.launcher import DEFAULT_ALGORITHMS, DEFAULT_FORMATS
    from ..multihost.network import parse_rate
    from ..schedule import SCHEDULES

    fmt_name = argument(format_name)
    rate = argument(lambda text: parse_rate(text) and text)  # checked, kept as typed

    p = sub.add_parser("bench", help=COMMANDS["bench"][0],
                       description="Without --hosts: time the codec (encode, decode and one "
                       "ring hop) on a large bf16 array, and quantize+dequantize of a large f32 "
                       "one, against the cheapest pass over the same memory (x + 1), side by "
                       "side in one run, for several formats, on jax's default device. With "
                       "--hosts N: N processes form one JAX job (gloo over TCP) and time every "
                       "algorithm x format x message size against the bf16 ring and the time "
                       "model; as root, --link caps each host's own network namespace at that "
                       "rate (else: loopback, uncapped). Timings on this machine.")
    p.add_argument("--mib", type=at_least(1), nargs="+", default=None,
                   help="sizes in MiB: of the bf16 (codec) and f32 (quantize+dequantize) "
                   "arrays (default 64), or with --hosts of each host's bf16 message "
                   "(default 1 2 4 8 16 32 64)")
    p.add_argument("--repeats", type=at_least(1), default=None,
                   help="timed calls per configuration; the median is kept (default 5, "
                   "with --hosts 3)")
    p.add_argument("--hosts", type=at_least(2), default=None,
                   help="run as this many processes (emulated hosts) of one JAX job")
    p.add_argument("--link", metavar="RATE", type=rate, default=None,
                   help="with --hosts, as root: cap each host's link, e.g. 100mbit, 1gbit")
    p.add_argument("--algorithms", nargs="+", choices=list(SCHEDULES),
                   default=None,
                   help=f"with --hosts (default: {' '.join(DEFAULT_ALGORITHMS)})")
    p.add_argument("--formats", nargs="+", type=fmt_name, metavar="FMT", default=None,
                   help=f"with --hosts: {UNQUANTIZED} (unquantized), {', '.join(FORMAT_NAMES)} "
                   f"or a variant such as int4/b16 (default: {' '.join(DEFAULT_FORMATS)})")
    p.add_argument("--timeout", type=at_least(10), default=None,
                   help=f"with --hosts: seconds the whole run may take (default {TIMEOUT_S})")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the results as JSON ('-' for stdout, then the table goes to "
                   "stderr)")
    p.add_argument("--plot", metavar="PATH", type=figure_path, default=None,
                   help="with --hosts: save the figure of measured against modelled seconds "
                   "(png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)


def cmd_bench(args) -> int:
    if args.hosts is not None:
        return cmd_bench_hosts(args)
    given = [flag for flag, value in (("--link", args.link), ("--plot", args.plot),
                                      ("--algorithms", args.algorithms),
                                      ("--formats", args.formats), ("--timeout", args.timeout))
             if value is not None]
    if given:
        raise ValueError(f"{', '.join(given)} go{'es' if len(given) == 1 else ''} with --hosts")
    from ..runs.bench import throughput

    results = throughput(args.mib or [64], repeats=args.repeats or 5)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(f"the codec on {results['device']} ({results['platform']}): GB/s over each "
          "program's fewest bytes (inputs read once, outputs written once), and the fraction "
          "of a copy's (the faster x + 1, bf16 or f32 on the same bytes), and the time over a "
          "bf16 a + b's (a plain ring hop) in this run", file=out)
    print(table(["path", "program", "format", "MiB of bf16", "time", "fewest bytes", "GB/s",
                 "of copy", "vs a + b"],
                [[r.get("path", "xla"), r["program"], r["format"] or "-", str(r["mib"]),
                  f"{r['seconds'] * 1e3:.2f} ms", f"{r['fewest_bytes'] / 1e6:.1f} MB",
                  f"{r['gbps']:.1f}", f"{r['of_copy']:.0%}", f"{r['to_add']:.2f}x"]
                 for r in results["codec"]]), file=out)
    print("quantize+dequantize of f32 against x + 1 and against int8's, same run:", file=out)
    print(table(["format", "MiB", "quantize+dequantize", "x + 1", "ratio", "vs int8", "GiB/s"],
                [[r["format"], str(r["mib"]), f"{r['quantize_dequantize_s'] * 1e3:.1f} ms",
                  f"{r['elementwise_s'] * 1e3:.1f} ms", f"{r['ratio']:.2f}x",
                  "-" if r["to_int8"] is None else f"{r['to_int8']:.2f}x",
                  f"{r['gib_per_s']:.2f}"] for r in results["quantizer"]]), file=out)
    print(f"{results['platform'].upper()} timings, median of the repeats, measured side by "
          "side in this run.", file=out)
    if args.json:
        write_json(args.json, results)
    return 0


def cmd_bench_hosts(args) -> int:
    import shlex

    from ..multihost import launcher

    args.algorithms = args.algorithms or list(launcher.DEFAULT_ALGORITHMS)
    args.formats = args.formats or list(launcher.DEFAULT_FORMATS)
    args.timeout = TIMEOUT_S if args.timeout is None else args.timeout
    mib, repeats = args.mib or [m >> 20 for m in launcher.DEFAULT_SIZES], args.repeats or 3
    command = ["equarx-ref", "bench", "--hosts", str(args.hosts),
               *(["--link", args.link] if args.link else []), "--mib", *map(str, mib),
               "--algorithms", *args.algorithms, "--formats", *args.formats,
               "--repeats", str(repeats),
               *(["--timeout", f"{args.timeout:g}"] if args.timeout != TIMEOUT_S else []),
               *(["--json", args.json] if args.json else [])]
    try:
        result = launcher.run(args.hosts, link=args.link, sizes=[m << 20 for m in mib],
                              algorithms=args.algorithms, formats=args.formats,
                              repeats=repeats, timeout=args.timeout,
                              progress=not args.no_progress)
    except (RuntimeError, TimeoutError) as e:
        print(f"equarx-ref bench: {e} (hosts, namespaces and links removed)", file=sys.stderr)
        return 1
    out = sys.stderr if args.json == "-" else sys.stdout
    c = result["chip"]
    print(f"{result['network']}; measured: link {c['link_bandwidth'] * 8 / 1e6:.0f} Mbit/s, "
          f"hop latency {c['hop_latency'] * 1e6:.0f} us, memory "
          f"{result['calibration']['memory_bytes_per_s'] / 1e9:.2f} GB/s, fresh pages "
          f"{c['fresh_bandwidth'] / 1e9:.2f} GB/s per host (these make the model's Chip)",
          file=out)
    print(table(["algorithm", "format", "message", "bytes/device", "seconds", "model",
                 "vs bf16 ring", "link", "compute", "plain add", "bitwise"],
                [[r["algorithm"], r["format"], bytes_text(r["message_bytes"]),
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
        write_json(args.json, {"command": shlex.join(command), **result})
    if args.plot:
        from ..viz import plot_measured

        ax = plot_measured(result["results"], title=f"{args.hosts} hosts at "
                           f"{result['link'] or 'loopback'}: CPU timings against the model")
        ax.figure.tight_layout()
        save_figure(ax.figure, args.plot, out)
    return 0 if all(r["bitwise_equal"] for r in result["results"]) else 1



def add_sweep(sub) -> None:
    from ..formats import Format
    from ..models.cost import CHIPS
    from ..runs.sweep import DATA, DEFAULT_ALGORITHMS, DEFAULT_FORMATS, DEFAULT_P, REMEDIES

    fmt_name = argument(lambda text: str(Format.parse(text)))  # quantized formats only

    p = sub.add_parser("sweep", help=COMMANDS["sweep"][0],
                       description="Every device count x algorithm x wire format x remedy "
                       "(stochastic rounding, Hadamard rotation, hop-aware bits) on the same "
                       "synthetic inputs (Gaussian, and Gaussian with outlier features): bits "
                       "per element on the wire, bytes per value each device sends, relative "
                       "error against the exact sum, the Pareto front, and the modelled "
                       "speedup on one TPU chip type (cost model, not a measurement).")
    p.add_argument("--p", type=at_least(2), nargs="+", default=list(DEFAULT_P),
                   help=f"device counts (default {' '.join(map(str, DEFAULT_P))})")
    p.add_argument("--algorithms", nargs="+", choices=list(DEFAULT_ALGORITHMS),
                   default=list(DEFAULT_ALGORITHMS))
    p.add_argument("--formats", nargs="+", type=fmt_name, metavar="FMT",
                   default=list(DEFAULT_FORMATS),
                   help=f"wire formats (default: {' '.join(DEFAULT_FORMATS)})")
    p.add_argument("--remedies", nargs="+", choices=list(REMEDIES), default=list(REMEDIES))
    p.add_argument("--data", nargs="+", choices=list(DATA), default=list(DATA))
    p.add_argument("--size", type=at_least(1), default=1 << 14,
                   help="values per device (default 16384)")
    p.add_argument("--chip", choices=sorted(CHIPS), default="v5e",
                   help="chip of the modelled speedup (default v5e)")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write every point as JSON ('-' for stdout, then the tables go to "
                   "stderr)")
    p.add_argument("--plot", metavar="PATH", type=figure_path, default=None,
                   help="save the map (png, svg, pdf)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_sweep)


def cmd_sweep(args) -> int:
    import shlex

    from .. import devices
    from ..runs import sweep

    sweep.configurations(args.p, args.algorithms, args.formats, args.remedies)  # or refused
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
    for kind in dict.fromkeys(args.data):
        print(f"\n{kind}:", file=out)
        print(table(["p", "algorithm", "format", "remedy", "bits/el", "bytes/value",
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
        write_json(args.json, {"command": shlex.join(command),
                                "devices": devices.describe_devices(devs), **result})
    if args.plot:
        from ..viz import plot_sweep

        save_figure(plot_sweep(result), args.plot, out)
    return 0
