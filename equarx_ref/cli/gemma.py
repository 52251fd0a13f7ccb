"""The Gemma commands: `gemma` (quality of quantized tensor-parallel communication) and
`outliers` (static int4 with bf16 outlier features). Each parses, calls one function of
`equarx_ref.gemma`, prints.
"""

from __future__ import annotations

import argparse
import sys

from . import COMMANDS
from .options import (
    argument,
    at_least,
    figure_path,
    format_name,
    save_figure,
    writable,
    write_json,
)


def _packaged_model():
    """The config of the model these commands run (the packaged Gemma 3 270M)."""
    from ..gemma.config import PRESETS

    return PRESETS["270m"]


def tp_size(minimum: int):
    """An argparse type: a tensor-parallel size the packaged model splits over (checked now,
    not after its weights load)."""
    def parse(text: str) -> int:
        from ..gemma.parallel import tp_size_error

        n = at_least(minimum)(text)
        why = tp_size_error(_packaged_model(), n)
        if why:
            raise argparse.ArgumentTypeError(why)
        return n
    return parse


def add_gemma(sub) -> None:
    from ..formats import FORMAT_NAMES, UNQUANTIZED
    from ..gemma.model import PRECISIONS  # jax, as quality: no heavier than the line below
    from ..gemma.quality import DEFAULT_FORMATS
    from ..schedule import ALGORITHMS

    fmt_name = argument(format_name)

    p = sub.add_parser("gemma", help=COMMANDS["gemma"][0],
                       description="Run Gemma 3 270M (real weights, float32) tensor-parallel "
                       "with every AllReduce algorithm x wire format and compare each run with "
                       "the exact one: NLL, perplexity, dNLL with its paired standard error, KL, "
                       "top-1 agreement, and the relative error at each AllReduce site.")
    p.add_argument("--tp", type=tp_size(1), default=4,
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
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the report as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--plot", metavar="PATH", type=figure_path, default=None,
                   help="save a figure (png, svg, pdf)")
    p.add_argument("--precision", choices=tuple(PRECISIONS), default="highest",
                   help="matmul precision of every run (default highest: full float32 on every "
                   "backend; 'default' lets a GPU use TF32, a TPU bf16 passes: faster, and the "
                   "numbers then depend on the chip); the report records it")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_gemma)


def cmd_gemma(args) -> int:
    from ..formats import UNQUANTIZED
    from ..gemma import figures, quality, report

    if all(a == "psum" and f != UNQUANTIZED for a in args.algorithms for f in args.formats):
        raise ValueError(f"nothing to run: psum runs unquantized only; add {UNQUANTIZED} to "
                         "--formats or another algorithm to --algorithms")
    result = quality.evaluate_text(None if args.text is None else args.text.read(),
                                   tp=args.tp, max_tokens=args.tokens,
                                   algorithms=args.algorithms, formats=args.formats,
                                   progress=not args.no_progress,
                                   precision=args.precision)  # ValueError: one line (main)
    out = sys.stderr if args.json == "-" else sys.stdout
    print(report.format_table(result), file=out)
    if args.json:
        write_json(args.json, result)
    if args.plot:
        save_figure(figures.plot_report(result), args.plot, out)
    return 0



def add_outliers(sub) -> None:
    p = sub.add_parser("outliers", help=COMMANDS["outliers"][0],
                       description="Calibrate static int4 AllReduce on Gemma 3 270M (per-site, "
                       "per-device, per-feature ranges on the calibration text, E/64 widest "
                       "features in bf16), then score it beside the dynamic formats on the "
                       "evaluation text: dNLL with paired SE, KL, top-1, bits per value and "
                       "bytes on the wire (counted and read from the compiled HLO).")
    p.add_argument("--tp", type=tp_size(2), default=4, help="tensor-parallel size (4)")
    p.add_argument("--tokens", type=at_least(3), default=None,
                   help="score only the first N tokens of the evaluation text")
    p.add_argument("--seq", type=at_least(2), default=256,
                   help="calibration sequence length in tokens (256)")
    features = _packaged_model().embed_dim

    def outliers(text: str) -> int:
        k = at_least(0)(text)
        if k > features:
            raise argparse.ArgumentTypeError(f"at most {features} (the model's features), "
                                             f"got {k}")
        return k

    p.add_argument("--outliers", type=outliers, default=None,
                   help=f"bf16 features per site, at most {features} (default E/64)")
    p.add_argument("--calibration", metavar="NPZ", default=None,
                   help="use this saved calibration instead of calibrating")
    p.add_argument("--save-calibration", metavar="NPZ", type=writable, default=None,
                   help="save the calibration state (.npz)")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the report as JSON ('-' for stdout, then the table goes to stderr)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_outliers)


def cmd_outliers(args) -> int:
    import shlex

    from .. import outliers
    from ..gemma import calibrate, report

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
        write_json(args.json, {"command": shlex.join(command), **result})
    return 0
