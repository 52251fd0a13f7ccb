"""The `check` command: this chip's quantizer and all_reduce, bitwise against the spec. It
parses, calls `runs.check.check`, prints one table and a verdict; exit status 1 on any
difference, with the first differing block shown. Progress goes to stderr, a line per part as
it starts (as `demo`'s compiling lines), unless --no-progress. --formats checks only the
formats named (and the all_reduce cases in them); an unknown name is refused in one line,
exit status 2.
"""

from __future__ import annotations

import sys

from . import COMMANDS
from .options import argument, table, writable, write_json


def chip_name(kind: str, platform: str) -> str:
    """How the verdict names a device: "CPU", "TPU v5 lite", "GPU (NVIDIA H100 80GB HBM3)"."""
    if kind.lower() == platform:
        return platform.upper()
    return kind if kind.lower().startswith(platform) else f"{platform.upper()} ({kind})"


def add_check(sub) -> None:
    from ..formats import Format

    p = sub.add_parser("check", help=COMMANDS["check"][0],
                       description="Quantize the spec's data classes with every check format "
                       "on this machine's default device (jit), by to_bytes(quantize(x)), by "
                       "the collectives' encode and with stochastic rounding (the spec given the "
                       "same uniforms), encode and decode them with the Mosaic codec's kernels "
                       "(native on a TPU, interpret mode elsewhere) and the GPU codec's "
                       "(native on a GPU, interpreted elsewhere), and run a small "
                       "all_reduce per algorithm; "
                       "compare every byte and value with the NumPy spec (equarx_ref.spec). "
                       "Exit status 1 on a difference, showing the first differing block.")
    p.add_argument("--formats", nargs="+", metavar="FMT",
                   type=argument(lambda text: str(Format.parse(text))), default=None,
                   help="check only these formats (any format name, e.g. int8 mxfp4 int4/b16 "
                   "int8/f32), and only the all_reduce cases in them (default: every check "
                   "format: the public ones, a six-bit MX float, an odd width and an f32 "
                   "scale, and every all_reduce case)")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the result as JSON ('-' for stdout, then the table goes to "
                   "stderr)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_check)


def _diff_lines(where: str, diff: dict) -> list[str]:
    lines = [f"first difference: {where}" + (f", by {diff['path']}" if "path" in diff else "")]
    for key in ("block", "device", "index"):
        if key in diff:
            lines.append(f"  {key}: {diff[key]}")
    if "values" in diff:
        lines.append(f"  values:   {diff['values']}")
    lines += [f"  expected: {diff['expected']}", f"  got:      {diff['got']}"]
    return lines


def cmd_check(args) -> int:
    from .. import devices
    from ..runs import check

    devs = devices.setup_devices(8)
    out = sys.stderr if args.json == "-" else sys.stdout
    formats = check.CHECK_FORMATS if args.formats is None else tuple(dict.fromkeys(
        args.formats))
    cases = None if args.formats is None else check.reduce_cases(formats)
    result = check.check(devs, formats, cases=cases, progress=None if args.no_progress else
                         lambda m: print(f"  checking {m}", file=sys.stderr, flush=True))
    rows, first = [], None
    for name, classes in result["formats"].items():
        bad = [c for c, d in classes.items() if d is not None]
        rows.append([name, f"{len(classes) - len(bad)} of {len(classes)}",
                     ", ".join(bad) or "-"])
        if bad and first is None:
            first = (f"{name}, {bad[0]}", classes[bad[0]])
    for part, label in (("kernels", "kernels"), ("gpu_kernels", "gpu kernels")):
        for name, classes in result[part].items():
            bad = [c for c, d in classes.items() if d is not None]
            rows.append([f"{label} {name}", f"{len(classes) - len(bad)} of {len(classes)}",
                         ", ".join(bad) or "-"])
            if bad and first is None:
                first = (f"{label} {name}, {bad[0]}", classes[bad[0]])
    for case, diff in result["all_reduce"].items():
        rows.append([f"all_reduce {case}", "equal" if diff is None else "DIFFERS", "-"])
        if diff is not None and first is None:
            first = (f"all_reduce {case}", diff)
    print(table(["format", "classes bitwise equal", "differing"], rows), file=out)
    n_classes = len(next(iter(result["formats"].values())))
    chip = chip_name(result["device"], result["platform"])
    if first is None:
        print(f"bitwise equal to the spec on {chip}: {len(result['formats'])} formats, "
              f"{n_classes} data classes; the Mosaic codec's kernels "
              f"{len(result['kernels'])} formats, the GPU codec's "
              f"{len(result['gpu_kernels'])}; all_reduce {len(result['all_reduce'])} cases on "
              f"{result['reduce_devices']}", file=out)
    else:
        print(f"NOT bitwise equal to the spec on {chip}", file=out)
        print("\n".join(_diff_lines(*first)), file=out)
    if args.json:
        write_json(args.json, result)
    return 0 if first is None else 1
