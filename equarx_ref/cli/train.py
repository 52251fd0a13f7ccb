"""The `train` command: quantized gradients in data-parallel training (chapter 08). It parses,
calls `runs.train.train` (or `runs.train.hop_statistics` with --hops), prints a table.
"""

from __future__ import annotations

import sys

from . import COMMANDS
from .options import argument, at_least, table, writable, write_json


def add_train(sub) -> None:
    from ..runs.train import VARIANTS, TrainConfig, max_steps

    defaults = TrainConfig()

    def steps(text: str) -> int:
        n = at_least(1)(text)
        if n % defaults.eval_every:
            raise ValueError(f"steps must be a multiple of {defaults.eval_every} (the loss is "
                             f"evaluated every {defaults.eval_every} steps), got {n}")
        if n > max_steps(defaults):
            raise ValueError(f"steps must be at most {max_steps(defaults)} (the batches of "
                             f"every step are drawn up front and must fit in memory), got {n}")
        return n

    p = sub.add_parser("train", help=COMMANDS["train"][0],
                       description="Train a small character-level language model data-parallel "
                       "on 8 simulated devices, its gradients summed by all_reduce in each "
                       "variant (wire format, algorithm, remedy), paired seeds: the change of "
                       "final train and validation loss against the f32 psum with standard "
                       "errors, the gradient's relative error, the share of coordinates flushed "
                       "to zero, the bytes sent. With --hops: the partial sums of the f32 run's "
                       "gradients hop by hop instead (what a ring quantizes at each hop).")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=None,
                   help="variants to run (default: all; the f32 psum baseline always runs)")
    p.add_argument("--steps", type=argument(steps), default=defaults.steps,
                   help=f"optimizer steps (default {defaults.steps})")
    p.add_argument("--seeds", type=at_least(1), default=None,
                   help=f"paired seeds per variant (default {defaults.seeds}); with one seed "
                   "there is no standard error (null in JSON)")
    p.add_argument("--hops", action="store_true",
                   help="the hop table of the f32 run's gradients (seed 0), not the "
                   "variants (so no --variants, --seeds), at steps 0, 100, 300 within --steps "
                   "and at the last step")
    p.add_argument("--json", metavar="PATH", type=writable, default=None,
                   help="write the result as JSON ('-' for stdout, then the table goes to "
                   "stderr)")
    p.add_argument("--no-progress", action="store_true", help="no progress lines")
    p.set_defaults(func=cmd_train)


def cmd_train(args) -> int:
    from .. import devices
    from ..runs import train

    if args.hops and (args.variants is not None or args.seeds is not None):
        raise ValueError("--variants and --seeds choose the variant runs; --hops tabulates the "
                         "f32 run of seed 0 alone")
    args.seeds = train.TrainConfig().seeds if args.seeds is None else args.seeds
    devs = devices.setup_devices(8)
    out = sys.stderr if args.json == "-" else sys.stdout
    config = train.TrainConfig(steps=args.steps, seeds=args.seeds)
    progress = None if args.no_progress else (lambda line: print(line, file=sys.stderr))
    if args.hops:
        result = train.hop_statistics(config, devices=devs)
        print(f"{result['format']} ring over {result['devices']} devices, the f32 run's "
              f"gradients (seed {result['seed']})", file=out)
        for step, rows in result["steps"].items():
            print(f"\nstep {step}:", file=out)
            print(table(["hop k", "rms growth", "flushed", "error"],
                        [[str(r["k"]), f"{r['rms_growth']:.2f}", f"{r['uniform_flushed']:.3f}",
                          f"{r['uniform_error']:.3f}"] for r in rows]), file=out)
    else:
        result = train.train(args.variants, config=config, devices=devs, progress=progress)
        se = lambda v: "n/a" if v is None else f"{v:.4f}"  # noqa: E731 (one seed: no SE)
        rows = [[name, f"{v['bits']:g}", str(v["wire_bytes"]),
                 f"{v['delta_val_loss']:+.4f} ± {se(v['delta_val_loss_se'])}",
                 f"{v['grad_rel_error']:.3f}", f"{v['flushed_share']:.3f}"]
                for name, v in result["variants"].items()]
        print(f"{devices.describe_devices(devs)}; {result['config']['parameters']} parameters; "
              f"{args.steps} steps x {args.seeds} seeds in {result['seconds']:.0f} s", file=out)
        print(table(["variant", "bits", "bytes/step", "Δ val loss ± SE", "grad rel err",
                     "flushed"], rows), file=out)
    if args.json:
        write_json(args.json, result)
    return 0
