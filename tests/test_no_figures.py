"""No measured figure in the package's docstrings and comments: they say what a thing is and
why. A figure a run measured (a time, a speedup, a byte ratio, a percentage, a "was X, now Y")
lives in a stored record (equarx_ref/data/*.json) and the page generated from it, which are
remade and checked with the code; prose that quotes one goes stale the day the code changes,
and git keeps the history. The code may point at the record ("data/tpu-bytes.json").

`FIGURE` is what a measured figure looks like; `ALLOWED` the few lines that match it and are
not measurements: arithmetic that follows from a format (16 / 8.5 = 1.88x), a public chip or
paper figure with its source, a project target, a bound derived in the essay."""

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "equarx_ref"

FIGURE = re.compile(r"""
      (?<![\w.^-])\d[\d.,]*\s?(?:ms|us|µs|ns|s|sec|seconds?|minutes?)\b(?![\^-])  # a time
    | \d[\d.]*x\b                                                # a ratio, 2.9x
    | \d[\d.]*\s?%                                               # a percentage
    | (?<![\w.])\d[\d.]*\s*(?:->|→)\s*~?\d                       # a history, 22.5 -> 5.7
    | \d[\d.]*\s?(?:[GMK]i?B|[GM]bit)/s                          # a rate
    | \(\s*[0-9a-f]{7,40}\s*\)                                   # a commit, (d081d17)
""", re.X)

#: (file, text on the line): figures that are not measurements.
ALLOWED = {
    # arithmetic of the formats: bits per value and their ratio to bf16
    ("equarx_ref/formats.py", "bf16; int4 costs 4.5 bits (3.56x)."),
    ("equarx_ref/models/predict.py", "16 / 8.5 = 1.88x fewer bytes than bf16"),
    ("equarx_ref/models/hlo_memory.py", "128 bytes (3.8x its data)"),
    # bounds derived in the essay
    ("equarx_ref/quantize.py", "0.19% (bf16 scales: int4, fp8) or 0.006% (int8)"),
    ("equarx_ref/models/error.py", "lands anywhere up to 2x above amax / qmax"),
    ("equarx_ref/models/error.py", "a power-of-two scale is up to 2x coarse"),
    # public figures with their source
    ("equarx_ref/models/chips.py", "latency of about 1 us is the book's part 3"),
    ("equarx_ref/models/prefill.py", "Gemma 3 12B 1.1x and 27B 1.25x faster prefill"),
    ("equarx_ref/scales.py", "rounded for only 87% of values"),
    # the project's targets, and the floor a ratio is read against
    ("equarx_ref/runs/bench.py", "100% is a codec as cheap as a copy"),
    ("equarx_ref/runs/tpu_bytes.py", "So 1.0x is a program as cheap as it can be"),
    ("equarx_ref/runs/tpu_bytes.py", "the floor agree (1.00x)"),
    ("equarx_ref/runs/tpu_bytes.py", "The project's targets are 2x for a"),
    ("equarx_ref/runs/tpu_bytes.py", "and 3x psum's for an AllReduce"),
    ("equarx_ref/runs/tpu_bytes.py", "Neither formulation comes near the 2x target"),
    ("equarx_ref/runs/tpu_bytes.py", "2x of its fewest bytes, a quantized AllReduce's within 3x"),
    ("equarx_ref/runs/tpu_readback.py", "re-priced time within 25% of the model's"),
    ("equarx_ref/runs/tpu_readback.py", "ring at >= 1.4x psum's"),
}


def _prose(path: Path) -> list[tuple[int, str]]:
    """(line, text) of every docstring line and comment of a module."""
    text = path.read_text(encoding="utf-8")
    out = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = node.body[0] if node.body else None
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant) \
                    and isinstance(doc.value.value, str):
                out += [(doc.lineno + i, line)
                        for i, line in enumerate(doc.value.value.splitlines())]
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    out += [(tok.start[0], tok.string) for tok in tokens if tok.type == tokenize.COMMENT]
    return out


def _figures() -> list[tuple[str, int, str]]:
    found = []
    for path in sorted(PKG.rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        for line, text in _prose(path):
            if FIGURE.search(text) and not any(f == rel and allowed in text
                                               for f, allowed in ALLOWED):
                found.append((rel, line, text.strip()))
    return found


def test_no_measured_figure_in_docstrings_or_comments():
    found = _figures()
    assert not found, ("measured figures in the package's prose (move them to a stored record "
                       "and point at it; or, if definitional, add them to ALLOWED):\n  "
                       + "\n  ".join(f"{f}:{line}: {text}" for f, line, text in found))


def test_every_allowed_figure_is_still_there():
    """An entry of `ALLOWED` whose line is gone goes too: the list stays the few it is."""
    prose = {str(p.relative_to(ROOT)): "\n".join(t for _, t in _prose(p))
             for p in PKG.rglob("*.py")}
    stale = [(f, text) for f, text in ALLOWED if text not in prose.get(f, "")]
    assert not stale, f"ALLOWED entries no longer in the package: {stale}"


def test_the_pattern_catches_what_it_is_for():
    for text in ("int8 22.5 -> 5.7 ms", "took 14.4 ms of CPU time", "the ring 2.77x",
                 "within -2% to +18%", "ran at 97-99%", "a 1 Gbit/s run", "0.043 s",
                 "the code before the rule (d081d17)", "68x -> 17x"):
        assert FIGURE.search(text), text
    for text in ("4 x T_seen x N x H / p", "2 x encoded(L)", "int8/b32", "block 32",
                 "the 2D torus", "p = 8", "f32 (E8M0: 2^-127)", "c^2 s^2 sum(k_i)",
                 "below 2^-126 s, so", '"c3 -> 1": its copy'):
        assert not FIGURE.search(text), text
