"""The package's layout, counted from its files: the core, the folders, the layers.

The contributing page's layout tables and its layers diagram come from here, so their file
names and line counts are the files' own. `LAYERS` is also what
tests/test_layers.py holds the imports to.
"""

from __future__ import annotations

import ast
import io
import tokenize

from .common import ROOT, Section

PKG = ROOT / "equarx_ref"

#: The library read in an afternoon: flat at the top of the package, in reading order.
CORE = ("formats", "elements", "scales", "rounding", "quantize", "wire", "program", "schedule",
        "execute", "collectives", "rules", "devices")

#: Bottom first. A module imports from its own folder and from the layers below, never above:
#: the spec, then the core, then what extends it. What the core needs from above (a size gate,
#: a hop plan, a rotation, a kernel codec) it looks up by name (`extensions.py`), and the
#: package's root says where each lives.
LAYERS = (
    (("spec", "data"), "the spec: NumPy and ml_dtypes only; the stored results: JSON. Neither "
     "imports anything of the package"),
    (("extensions", "formats", "devices", "_checks", "_jax_private", "_lazy"),
     "the core's extension points; the element grids and formats; the mesh"),
    (("elements", "scales", "rounding"),
     "element codes and their packing; block scales, exactly; rounding onto the grid, exactly"),
    (("quantize", "wire", "program", "schedule", "autodiff"),
     "the quantizer; its wire codec; a schedule as data and its walk; who sends what, when; "
     "the derivative of a collective"),
    (("execute", "collectives", "rules"),
     "a schedule executed; all_reduce and AllReduce; their argument rules"),
    (("models", "remedies", "kernels"),
     "bytes, error and time read off a schedule; rotation; the Pallas TPU ring, the Mosaic "
     "codec and the GPU codec"),
    (("outliers",), "static int4 with outlier features, calibrated"),
    (("gemma",), "the tensor-parallel model that uses them"),
    (("runs", "viz"), "what each command runs; every figure"),
    (("multihost",), "the same runs as several processes over real links"),
    (("cli",), "the command line: parse, call one function, print"),
)


def count(path) -> tuple[int, int]:
    """(lines, lines of code) of a Python file: code leaves out blank lines, comments and
    docstrings."""
    text = path.read_text(encoding="utf-8")
    docs = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                docs.update(range(body[0].lineno, body[0].end_lineno + 1))
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    return len(text.splitlines()), len(code - docs)


def _summary(path) -> str:
    """The first line of a module's essay, without its closing period."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return doc.splitlines()[0].rstrip(".") if doc else ""


def core() -> list[tuple[str, int, int, str]]:
    """(file, lines, lines of code, first line of its essay) for each core module."""
    return [(f"{name}.py", *count(PKG / f"{name}.py"), _summary(PKG / f"{name}.py"))
            for name in CORE]


def folders() -> list[tuple[str, list[tuple[str, int]], str]]:
    """(folder, [(file, lines)], first line of its essay) for each subpackage."""
    out = []
    for init in sorted(PKG.glob("*/__init__.py")):
        files = [(p.name, count(p)[0]) for p in sorted(init.parent.glob("*.py"))
                 if p.name != "__init__.py"]
        out.append((init.parent.name + "/", files, _summary(init)))
    return out


def _number(n: int) -> str:
    """A small count in words, as prose writes it."""
    words = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
             "eleven", "twelve")
    return words[n] if n < len(words) else str(n)


def files() -> Section:
    """The contributing page's layout: the core with its sizes, then each folder's files."""
    rows = core()
    lines, code = sum(r[1] for r in rows), sum(r[2] for r in rows)
    out = [f"The core, the library you read in an afternoon: {_number(len(rows))} files, "
           f"{lines:,} lines "
           f"({code:,} of code, without essays, docstrings and comments).", "",
           "| core | lines | code | what |", "| --- | ---: | ---: | --- |"]
    out += [f"| `equarx_ref/{f}` | {n} | {c} | {what} |" for f, n, c, what in rows]
    out += ["", "Everything else sits in a folder named for its purpose (lines per file):", "",
            "| folder | files | what |", "| --- | --- | --- |"]
    out += [f"| `equarx_ref/{d}` | {', '.join(f'`{f}` {n}' for f, n in files)} | {what} |"
            for d, files, what in folders()]
    rest = sorted(p.name for p in PKG.glob("*.py")
                  if p.stem not in CORE and p.name != "__init__.py")
    out += ["", "Beside them: " + ", ".join(f"`{f}` ({count(PKG / f)[0]} lines)" for f in rest)
            + "; the layers they import through are drawn below.", ""]
    return Section("\n".join(out))


def layers() -> Section:
    """The layers, top first, as the contributing page draws them."""
    width = max(len(", ".join(units)) for units, _ in LAYERS)
    rows = [f"{', '.join(units):<{width}}   {what}" for units, what in reversed(LAYERS)]
    return Section("```text\n" + "\n".join(rows) + "\n```\n")
