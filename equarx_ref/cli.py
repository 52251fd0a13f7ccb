"""The `equarx-ref` command: thin: it parses, calls the package, prints.

    equarx-ref demo     every algorithm x format side by side: bits, bytes, error, CPU time
    equarx-ref bench    quantize+dequantize throughput against a plain elementwise pass
    equarx-ref gemma    quality of quantized tensor-parallel communication on Gemma 3 270M
"""

from __future__ import annotations

import argparse
import sys


def _add_demo(sub) -> None:
    p = sub.add_parser("demo", help="run the collectives side by side (the main job)")
    p.set_defaults(func=_cmd_demo)


def _cmd_demo(args) -> int:
    raise SystemExit("demo: not yet wired")


def _add_gemma(sub) -> None:
    # Owned by the Gemma work (issue 4): add its options here.
    p = sub.add_parser("gemma", help="quality of quantized TP communication on Gemma 3 270M")
    p.set_defaults(func=_cmd_gemma)


def _cmd_gemma(args) -> int:
    raise SystemExit("gemma: not yet wired")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="equarx-ref", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    _add_demo(sub)
    _add_gemma(sub)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
