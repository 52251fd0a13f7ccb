"""The TPU commands: `model` (the time model's report) and `kernels` (the Pallas kernels'
checks). Each parses, calls one function of `equarx_ref.runs`, prints.
"""

from __future__ import annotations

import sys

from . import COMMANDS
from .options import (
    argument,
    at_least,
    bytes_text,
    figure_path,
    save_figure,
    seconds_text,
    table,
    writable,
    write_json,
)


def add_model(sub) -> None:
    from ..models.cost import CHIPS
    from ..schedule import SCHEDULES

    p = sub.add_parser("model", help=COMMANDS["model"][0],
                       description="The time model (equarx_ref/models/cost.py) on one TPU chip "
                       "type: for messages of 1 KiB to 1 GiB, the modelled time of the unquantized "
                       "AllReduce and the speedup of int8 and int4, each at its best pipeline "
                       "depth; then Gemma 3 12B and 27B prefill at the given TP. Modelled "
                       "figures, not measurements.")
    p.add_argument("--chip", choices=sorted(CHIPS), default="v5e", help="default v5e")
    p.add_argument("--devices", type=at_least(2), default=8, help="chips in the ring (8)")
    p.add_argument("--algorithm", choices=list(SCHEDULES),
                   default="bidir_ring", help="default bidir_ring")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the rows as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", type=figure_path, default=None,
                   help="save the speedup curves (png, svg, pdf)")
    p.set_defaults(func=cmd_model)


def cmd_model(args) -> int:
    from ..models.cost import CHIPS
    from ..runs.model import model_report

    out = sys.stderr if args.json == "-" else sys.stdout
    report = model_report(args.chip, args.devices, args.algorithm)
    chip, rows = CHIPS[args.chip], report["rows"]
    print(f"{chip.name}, {report['devices']} chips, {report['algorithm']}; modelled "
          f"({chip.source})", file=out)
    print(table(["message", "bf16", "int8", "speedup", "k", "int4", "speedup", "k"],
                [[bytes_text(r["message_bytes"]), seconds_text(r["bf16_seconds"]),
                 seconds_text(r["int8_seconds"]), f"{r['int8_speedup']:.2f}x",
                 str(r["int8_num_chunks"]), seconds_text(r["int4_seconds"]),
                 f"{r['int4_speedup']:.2f}x", str(r["int4_num_chunks"])] for r in rows]),
          file=out)
    print("crossover (quantized faster from): " + ", ".join(
        f"{k} {bytes_text(v)}" for k, v in report["crossover_bytes"].items()) + " (the chip "
        "figures carry no fixed cost of quantizing, so only block padding loses)", file=out)
    print(table(["prefill (2048 tokens)", "matmuls", "AllReduce bf16", "int8", "speedup"],
                [[r["model"], seconds_text(r["compute_s"]), seconds_text(r["bf16_allreduce_s"]),
                 seconds_text(r["int8_allreduce_s"]), f"{r['speedup']:.2f}x"]
                for r in report["prefill"]]), file=out)
    print("matmuls at 50% of peak bf16 FLOP/s; the paper measured 1.1x (12B) and 1.25x (27B) "
          "on TPU (EQuARX, arXiv 2506.17615).", file=out)
    if args.json:
        write_json(args.json, report)
    if args.plot:
        from ..viz import plot_speedup

        save_figure(plot_speedup(report).figure, args.plot, out)
    return 0


def add_kernels(sub) -> None:
    from ..runs.tpu_matrix import FAMILIES

    p = sub.add_parser("kernels", help=COMMANDS["kernels"][0],
                       description="The Pallas ring AllReduce (impl='pallas') against the XLA "
                       "path: bitwise equality and the race detector's count, in TPU interpret "
                       "mode on CPU devices (a deliberately broken kernel must show races). On "
                       "a TPU: the fused hop kernel's GB/s against XLA's hop and the chip's HBM "
                       "bandwidth, measured on the chip. Without a TPU, no TPU figure. With "
                       "--compile: every kernel and collective compiled for TPU slices with "
                       "libtpu, on this machine (nothing runs on a TPU).")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the report as JSON ('-' for stdout, then the text goes to stderr)")
    p.add_argument("--compile", metavar="TOPOLOGY", type=argument(topologies), default=None,
                   help="instead: compile every kernel and collective for TPU slices, e.g. "
                   "v5e:2x4 or v5e:2x4,v6e:2x4, with libtpu (no TPU needed; pip install "
                   "'jax[tpu]==<your jax>'), and print which compiled")
    p.add_argument("--read-back", action="store_true",
                   help="with --compile: also read the TPU programs back (wire bytes from the "
                   "HLO, what XLA:TPU overlaps, its bytes accessed against the time model)")
    p.add_argument("--bytes", metavar="MIB", type=argument(positive_mib), nargs="?", const=16.0,
                   default=None,
                   help="with --compile: also XLA:TPU's bytes accessed by the codec (encode, "
                   "decode, hop on MIB MiB of bf16, default 16) over the fewest bytes each must "
                   "move, and by the p=8 AllReduces (MIB per chip) over lax.psum's")
    p.add_argument("--schedule", action="store_true",
                   help="with --compile: also read libtpu's own bundle schedule back (static "
                   "cycles of the codec's kernels and of the AllReduces at 16 MiB of bf16, "
                   "priced against HBM time; yardsticks first)")
    p.add_argument("--only", choices=(*FAMILIES, "none"), nargs="+", default=None,
                   help="with --compile: only these families ('none' with --read-back: the "
                   "read-back alone)")
    p.add_argument("--jobs", type=at_least(1), default=1,
                   help="with --compile: compile on this many threads (one process: libtpu "
                   "allows one at a time)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_kernels)


def positive_mib(text: str) -> float:
    """`--bytes`'s value: MiB of bf16, a positive number whose values fill whole blocks on 8
    chips (a multiple of 1/64 MiB)."""
    mib = float(text)
    if not mib > 0 or (mib * 64) % 1:
        raise ValueError(f"expected a positive multiple of 1/64 MiB, got {text!r}")
    return mib


def topologies(text: str) -> tuple[str, ...]:
    """`--compile`'s value: TPU slices separated by commas, each CHIP:SHAPE ("v5e:2x4")."""
    names = tuple(t.strip() for t in text.split(",") if t.strip())
    bad = [t for t in names if t.count(":") != 1 or not all(t.split(":"))]
    if not names or bad:
        raise ValueError(f"expected TPU slices like v5e:2x4 or v5e:2x4,v6e:2x4, got {text!r}")
    return names


def _compile_command(args) -> str:
    """The command line that made a --compile report (stored with it)."""
    return " ".join(["equarx-ref kernels --compile", ",".join(args.compile),
                     *(["--only", *args.only] if args.only else []),
                     *(["--read-back"] if args.read_back else []),
                     *([f"--bytes {args.bytes:g}"] if args.bytes is not None else []),
                     *(["--schedule"] if args.schedule else []),
                     *([f"--jobs {args.jobs}"] if args.jobs != 1 else []),
                     *(["--json", args.json] if args.json else [])])


def cmd_kernels(args) -> int:
    out = sys.stderr if args.json == "-" else sys.stdout
    progress = None if args.no_progress else lambda m: print(f"  {m}", file=sys.stderr)
    if args.compile is not None:  # before anything else starts jax's backends: libtpu's env
        from ..runs import tpu_matrix

        if args.only and set(args.only) == {"none"} and not args.read_back \
                and args.bytes is None and not args.schedule:
            raise ValueError("nothing to run: --only none compiles no family; add --read-back, "
                             "--bytes or --schedule for those alone")

        status, report = tpu_matrix.run(
            args.compile, families=tuple(args.only) if args.only else None,
            read_back_too=args.read_back, bytes_mib=args.bytes, schedule=args.schedule,
            jobs=args.jobs, out=out,
            progress=progress)
        if args.json and report:
            write_json(args.json, {"command": _compile_command(args), **report})
        return status
    if args.only or args.read_back or args.bytes is not None or args.schedule or \
            args.jobs != 1:
        raise ValueError("--only, --read-back, --bytes, --schedule and --jobs go with "
                         "--compile TOPOLOGY")
    from .. import devices
    from ..runs import kernel_checks

    devs = devices.setup_devices(8)
    report = kernel_checks.report(progress=progress)
    if not report["tpu"]:
        print(f"no TPU here ({devices.describe_devices(devs)}): the kernels ran in TPU "
              "interpret mode (correctness and races only, no speed)", file=out)
    rows = [[str(c["p"]), c["algorithm"], c["format"], str(c["num_chunks"]),
             c["sabotage"] or "-", "yes" if c["bitwise"] else "NO",
             "-" if c["races"] is None else str(c["races"])] for c in report["checks"]]
    print(table(["p", "algorithm", "format", "pieces", "sabotage", "bitwise = xla", "races"],
                rows), file=out)
    if not report["tpu"]:
        print("whether they compile for a TPU: equarx-ref kernels --compile v5e:2x4 (libtpu)",
              file=out)
    for t in report["timings"]:
        hbm = "" if t["hbm_gbps"] is None else f", {t['kernel_gbps'] / t['hbm_gbps']:.0%} of HBM"
        print(f"{t['chip']} fused hop {t['format']}: {t['kernel_gbps']:.0f} GB/s (XLA "
              f"{t['xla_gbps']:.0f} GB/s{hbm}), bitwise {t['bitwise']}", file=out)
    for name, error in report["timing_errors"].items():
        print(f"fused hop {name} not timed on the chip: {error}", file=out)
    if args.json:
        write_json(args.json, report)
    return 0
