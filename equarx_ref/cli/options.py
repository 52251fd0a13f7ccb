"""What every command shares: argument types that refuse bad input in one line, and outputs
(JSON, figures, tables) written only to paths checked writable before the work starts; a write
that fails raises `OutputError` (one line, exit status 1).
"""

from __future__ import annotations

import argparse
import os

from .._checks import count


def at_least(minimum: int):
    """An argparse type: an integer >= minimum, refused with the rule in one line."""
    def parse(text: str) -> int:
        try:
            return count(int(text), "value", minimum=minimum)
        except (TypeError, ValueError):
            raise argparse.ArgumentTypeError(
                f"expected an integer >= {minimum}, got {text!r}") from None
    return parse


def argument(parse):
    """An argparse type from a parser that raises ValueError: its message, in one line."""
    def check(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
    return check


def format_name(text: str) -> str:
    """A wire format as typed ("int8", "int4/b16", "bf16" for none) -> its short name."""
    from ..formats import format_label, parse_format

    return format_label(parse_format(text))


def writable(text: str) -> str:
    """An argparse type: a file path we can write (checked now, not after minutes of work). A
    path that names a directory ("out/", "out/.", an existing one) is refused, whether or not
    the directory exists: a file cannot be written there."""
    if text == "-":
        return text
    if not text or text.endswith((os.sep, "/")) or os.path.basename(text) in (".", ".."):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: it names a directory, not a "
                                         "file")
    parent = os.path.dirname(os.path.abspath(text))
    if os.path.isdir(text) or not os.path.isdir(parent) or not os.access(parent, os.W_OK) or \
            (os.path.exists(text) and not os.access(text, os.W_OK)):
        raise argparse.ArgumentTypeError(f"cannot write {text!r}")
    return text


#: What a figure path may end with (matplotlib's Agg canvas writes these); none means png.
FIGURE_TYPES = ("png", "svg", "svgz", "pdf", "eps", "ps", "jpg", "jpeg", "tif", "tiff")


def figure_path(text: str) -> str:
    """An argparse type: a writable path whose extension names a figure type."""
    if text == "-":
        raise argparse.ArgumentTypeError("a figure goes to a file, not to stdout ('-')")
    ext = os.path.splitext(text)[1][1:].lower()
    if ext and ext not in FIGURE_TYPES:
        raise argparse.ArgumentTypeError(f"cannot write a figure as .{ext}: use one of "
                                         f"{', '.join(FIGURE_TYPES)}")
    return writable(text)


class OutputError(Exception):
    """Writing an output file failed (disk full, device gone...): one line, exit status 1."""


def write(path: str, data: bytes) -> None:
    try:
        with open(path, "wb") as f:
            f.write(data)
    except OSError as e:
        raise OutputError(f"cannot write {path!r}: {e.strerror or e}") from None


def save_figure(fig, path: str, out) -> None:
    """Render `fig` in memory, then write it (matplotlib alone ignores some write errors)."""
    import io

    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=os.path.splitext(path)[1][1:].lower() or "png", dpi=120)
    finally:
        plt.close(fig)
    write(path, buf.getvalue())
    print(f"figure: {path}", file=out)


def table(headers: list[str], rows: list[list[str]]) -> str:
    """Right-aligned columns under `headers` (no rows: the headers alone)."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))  # noqa: E731
    return "\n".join([line(headers), line(["-" * w for w in widths]), *map(line, rows)])


def strict_json(obj):
    """`obj` with every non-finite float (NaN, +-inf) as None: JSON (RFC 8259) has no NaN, and
    Python's `json` would write the bare word `NaN` that other readers refuse."""
    import math

    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj


def write_json(path: str, obj) -> None:
    """`obj` as JSON (non-finite floats as null) to `path`, or to stdout for "-"."""
    import json

    text = json.dumps(strict_json(obj), indent=1, allow_nan=False)
    if path == "-":
        print(text)
    else:
        write(path, text.encode("utf-8"))



def bytes_text(nbytes: int) -> str:
    """A byte count as people read it: 512 B, 4 KiB, 1.5 MiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):g} {unit}"
    return f"{nbytes} B"


def seconds_text(seconds: float) -> str:
    """Seconds in ms above a millisecond, else in us."""
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} us"
