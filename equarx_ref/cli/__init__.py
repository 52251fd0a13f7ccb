"""equarx-ref: quantized AllReduce side by side: error, bytes on the wire, speed.

    equarx-ref demo     every algorithm x bf16, int8, int4, fp8_e4m3: bits, bytes, error, CPU time
    equarx-ref bench    codec throughput; --hosts N: a real multi-host run, capped links
    equarx-ref gemma    quality of quantized tensor-parallel communication on Gemma 3 270M
    equarx-ref model    modelled TPU time: speedup against message size, pipeline depth, prefill
    equarx-ref kernels  the Pallas TPU kernels: bitwise and race checks; GB/s on a real TPU
    equarx-ref outliers static int4 + bf16 outlier features (calibrated) on Gemma 3 270M
    equarx-ref sweep    the map: bits on the wire against error, every algorithm, format, remedy
    equarx-ref train    quantized gradients in data-parallel training: loss, error, bytes
    equarx-ref check    this chip's quantizer and all_reduce, bitwise against the spec

(This folder only parses arguments, calls one library function per command and prints:
`options.py` holds the argument types and outputs every command shares, `collectives.py`,
`tpu.py`, `gemma.py`, `train.py` and `check.py` the commands by subject. A command imports
what it needs only when it runs, so `equarx-ref --help` stays light.
Exits: 0 done; 1 a failure while running (out of memory) or writing an output (one line); 2 a
bad argument (before any work starts: one line naming the command, "equarx-ref demo: error:
...", then, for an option the parser refuses, that command's usage); 130 Ctrl-C; 141 the reader
of the output went away.)
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import os
import signal
import sys
import threading
import tomllib
from importlib import metadata
from pathlib import Path

from .options import OutputError


class _Parser(argparse.ArgumentParser):
    """argparse, but the error comes first, one line naming the command ("equarx-ref demo:
    error: ..."), then the command's usage (argparse prints them the other way round)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n{self.format_usage()}")


#: Every command: (one-line help, the module of this folder with its `add_NAME(sub)`, which
#: adds its full parser, and `cmd_NAME(args)`, which runs it). Only the command being run gets
#: its full parser, so `equarx-ref --help` imports none of the package's heavy modules.
COMMANDS = {
    "demo": ("run the collectives side by side (the main job)", "collectives"),
    "bench": ("codec throughput; with --hosts, a real multi-host run", "collectives"),
    "gemma": ("quality of quantized TP communication on Gemma 3 270M", "gemma"),
    "model": ("modelled TPU time: speedup against message size, prefill", "tpu"),
    "kernels": ("the Pallas TPU kernels: checks; GB/s on a real TPU", "tpu"),
    "outliers": ("static int4 + bf16 outliers (Dong et al.) on Gemma", "gemma"),
    "sweep": ("the map: bits on the wire against error, and remedies", "collectives"),
    "train": ("quantized gradients in data-parallel training (chapter 08)", "train"),
    "check": ("this chip bitwise against the spec: every format, every data class", "check"),
}


def command_module(name: str):
    """The module of this folder that holds command `name`'s parser and its run."""
    return importlib.import_module(f".{COMMANDS[name][1]}", __name__)


def version() -> str:
    """The package's version: its installed metadata, or, run from a source tree (the checkout
    on PYTHONPATH, nothing installed), the `version` of the checkout's pyproject.toml."""
    try:
        return metadata.version("equarx-ref")
    except metadata.PackageNotFoundError:
        pass
    try:
        with open(Path(__file__).resolve().parents[2] / "pyproject.toml", "rb") as f:
            project = tomllib.load(f)["project"]
        if project["name"] == "equarx-ref":
            return f"{project['version']} (source tree)"
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        pass
    return "unknown (not installed, no pyproject.toml beside the package)"


def _parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = _Parser(prog="equarx-ref", description=__doc__.split("\n\n(")[0],
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    chosen = next((a for a in argv if not a.startswith("-")), None)
    for name, (help_, _) in COMMANDS.items():
        if name == chosen:
            getattr(command_module(name), f"add_{name}")(sub)
        else:
            sub.add_parser(name, help=help_)
    parser.commands = sub.choices  # each command's own parser, to word its errors
    return parser


def _parse(argv: list[str]) -> argparse.Namespace:
    """The arguments; an unknown option is refused by the command it was given to, with that
    command's name and usage (plain argparse names the top-level parser: "equarx-ref")."""
    parser = _parser(argv)
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        parser.commands[args.command].error(f"unrecognized arguments: {' '.join(unknown)}")
    return args


def _quiet_stdout() -> None:
    """After a closed pipe: stdout to /dev/null, so the exit's flush cannot fail again."""
    with contextlib.suppress(OSError, ValueError, AttributeError, io.UnsupportedOperation):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


#: Seconds a Ctrl-C gives the command to unwind before the process ends anyway.
INTERRUPT_GRACE_S = 5.0


@contextlib.contextmanager
def _ctrl_c_ends(command: str):
    """Ctrl-C raises KeyboardInterrupt, as Python's own handler does, and ends the process
    `INTERRUPT_GRACE_S` later if the command is still running then. The interrupt cannot rest
    on the exception alone: raised inside a callback that a library runs from C++ (jax's, while
    it compiles), it can be reported there and dropped, and the run goes on. A dropped one is
    not reported: the timer ends the run with the same line. Off the main thread (where no
    handler can be set) nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    timers: list[threading.Timer] = []

    def finish():
        print(f"{command}: interrupted", file=sys.stderr, flush=True)
        os._exit(130)

    def on_sigint(signum, frame):
        if not timers:
            timers.append(threading.Timer(INTERRUPT_GRACE_S, finish))
            timers[0].daemon = True
            timers[0].start()
        raise KeyboardInterrupt

    def unraisable(u, hook=sys.unraisablehook):
        if not issubclass(u.exc_type, KeyboardInterrupt):
            hook(u)

    previous, hook = signal.signal(signal.SIGINT, on_sigint), sys.unraisablehook
    sys.unraisablehook = unraisable
    try:
        yield
    finally:
        for timer in timers:
            timer.cancel()
        signal.signal(signal.SIGINT, previous)
        sys.unraisablehook = hook


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns the exit status (module docstring). Every command's failures
    end the same way: one line on stderr, never a traceback, for a bad argument, a failed
    write, Ctrl-C or a closed pipe."""
    argv = sys.argv[1:] if argv is None else list(argv)
    command = " ".join(["equarx-ref", *(a for a in argv[:1] if a in COMMANDS)])
    try:
        args = _parse(argv)
        with _ctrl_c_ends(command):
            status = args.func(args) or 0
        sys.stdout.flush()  # a closed pipe shows here, not in the exit's flush
        return status
    except BrokenPipeError:  # the reader went away (`equarx-ref model | head -1`): quietly
        _quiet_stdout()
        return 141
    except KeyboardInterrupt:
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except OutputError as e:
        print(f"{command}: error: {e}", file=sys.stderr)
        return 1
    except (ValueError, ImportError) as e:  # bad input found by the package: one line
        print(f"{command}: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # a run too large for this machine: one line, not a traceback
        if not _out_of_memory(e):
            raise
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        print(f"{command}: error: out of memory ({first}); try smaller sizes", file=sys.stderr)
        return 1


def _out_of_memory(e: BaseException) -> bool:
    """Python's MemoryError, XLA's RESOURCE_EXHAUSTED or C++'s std::bad_alloc (an allocation
    that could not be made)."""
    text = str(e)
    return isinstance(e, MemoryError) or "RESOURCE_EXHAUSTED" in text or \
        "Out of memory" in text or "bad_alloc" in text

