"""mkdocs hooks: the parts of the site that are generated, so that nothing is typed by hand.

- Nav: "Course" lists every notebook in notebooks/ (title from its first heading), "API reference"
  one page per module of the package (mkdocstrings renders the docstrings).
- Numbers: a page writes a marker `<!-- gen:NAME -->` and the generator NAME below replaces it
  with a table or figure computed by the package itself (formats, byte counts), or read from the
  stored output of a command that was actually run (docs/data/*.json, the command beside it).
"""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
DATA = DOCS / "data"
PKG = ROOT / "equarx_ref"
MARKER = re.compile(r"<!-- gen:([a-z0-9_-]+) -->")
GENERATORS: dict = {}
FIGURES: dict[str, bytes] = {}  # site path -> PNG bytes, added as generated files


def generator(name):
    def deco(fn):
        GENERATORS[name] = fn
        return fn
    return deco


# ---------------------------------------------------------------------------- nav and API pages

def _notebooks() -> list[tuple[str, str]]:
    out = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        src = "".join(cells[0]["source"]) if cells else ""
        title = src.split("\n", 1)[0].lstrip("# ").strip() or nb.stem
        out.append((title, f"notebooks/{nb.name}"))
    return out


def _modules() -> list[tuple[str, str]]:
    """(dotted module name, first docstring line) for each public module and subpackage."""
    import ast

    mods = []
    for p in sorted(PKG.iterdir()):
        if p.name.startswith("_") or p.name == "cli.py":
            continue
        if p.suffix == ".py":
            name, src = f"equarx_ref.{p.stem}", p
        elif (p / "__init__.py").is_file():
            name, src = f"equarx_ref.{p.name}", p / "__init__.py"
        else:
            continue
        doc = ast.get_docstring(ast.parse(src.read_text(encoding="utf-8"))) or ""
        mods.append((name, doc.strip().split("\n", 1)[0]))
    return mods


def repo_url() -> str:
    """pyproject's `[project.urls] Repository`: the one place the repository URL lives."""
    import tomllib

    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["project"]["urls"]["Repository"].rstrip("/")


def on_config(config):
    url = repo_url()
    config["repo_url"] = url
    config["repo_name"] = url.removeprefix("https://github.com/")
    nav = config["nav"]
    for i, entry in enumerate(nav):
        (key, _), = entry.items()
        if key == "Course":
            nav[i] = {key: [{t: p} for t, p in _notebooks()]}
        elif key == "API reference":
            nav[i] = {key: [{"Overview": "api/index.md"}]
                      + [{m.split(".", 1)[1]: f"api/{m.split('.', 1)[1]}.md"}
                         for m, _ in _modules()]}
    return config


def on_files(files, config):
    mods = _modules()
    lines = ["# API reference", "",
             "Everything is re-exported by `import equarx_ref as eq`; the pages below document "
             "each module from its docstrings.", "",
             "| Module | What it is |", "|---|---|"]
    for m, first in mods:
        short = m.split(".", 1)[1]
        lines.append(f"| [`{m}`]({short}.md) | {first} |")
        opts = "\n    options:\n      show_submodules: true" if (PKG / short).is_dir() else ""
        files.append(File.generated(config, f"api/{short}.md", content=f"::: {m}{opts}\n"))
    files.append(File.generated(config, "api/index.md", content="\n".join(lines) + "\n"))
    # Figures are produced while rendering pages; generate them now so links validate.
    FIGURES.clear()
    for page in ("index.md", "results.md", "concepts.md"):
        text = (DOCS / page).read_text(encoding="utf-8")
        for name in MARKER.findall(text):
            _render(name)
    for path, png in FIGURES.items():
        files.append(File.generated(config, path, content=png))
    return files


_CACHE: dict[str, str] = {}


def _render(name: str) -> str:
    if name not in _CACHE:
        if name not in GENERATORS:
            raise KeyError(f"docs: no generator for <!-- gen:{name} --> (see docs/hooks.py)")
        _CACHE[name] = GENERATORS[name]()
    return _CACHE[name]


def on_pre_build(config):
    _CACHE.clear()


def on_page_markdown(markdown, page, config, files):
    return MARKER.sub(lambda m: _render(m.group(1)), markdown)


# ---------------------------------------------------------------------------- helpers

def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    return buf.getvalue()


def _table(header: list[str], rows: list[list]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _load(name: str) -> dict:
    path = DATA / name
    if not path.is_file():
        raise FileNotFoundError(f"docs: {path} is missing; regenerate it (see docs/results.md)")
    return json.loads(path.read_text(encoding="utf-8"))


# ---------------------------------------------------------------------------- generators


def _presets():
    import equarx_ref as eq

    return [eq.Format.int8(), eq.Format.int8(scale_dtype="float32"), eq.Format.int4(),
            eq.Format.fp8_e4m3(), eq.Format.fp8_e5m2(), eq.Format.mxfp8(), eq.Format.mxfp4()]


@generator("formats")
def _gen_formats() -> str:
    """Concepts: every preset's bits per element and one-quantization error, from the package."""
    import equarx_ref as eq

    rows = []
    for f in _presets():
        scale = "E8M0 (power of two)" if f.is_mx else f.scale_dtype
        rows.append([f"`{f.name}`", f.element, f.block_size, scale, f"{f.bits_per_element:g}",
                     f"{16 / f.bits_per_element:.2f}x",
                     f"{100 * eq.gaussian_relative_error(f):.2f}%"])
    return (_table(["format", "element", "block", "scale", "bits / element", "vs bf16",
                    "relative RMS error of one quantization (Gaussian data)"], rows)
            + "\n\n*Computed by `Format.bits_per_element` and `gaussian_relative_error(fmt)` "
            "when this site was built.*")


@generator("wire-bytes")
def _gen_wire_bytes() -> str:
    """Concepts: bytes per device and predicted error of every algorithm, from the package."""
    import equarx_ref as eq

    n, p = 1 << 20, 8
    base = eq.wire_bytes(n, p, fmt=None, algorithm="ring", dtype="bfloat16")
    rows = []
    for fmt in (None, eq.Format.int8(), eq.Format.int4()):
        for alg in ("ring", "bidir_ring", "two_shot", "one_shot"):
            b = eq.wire_bytes(n, p, fmt=fmt, algorithm=alg, dtype="bfloat16")
            err = eq.predicted_relative_error(fmt, alg, p)
            rows.append([f"`{alg}`", "bf16 (unquantized)" if fmt is None else f"`{fmt.name}`",
                         f"{b:,}", f"{b / base:.3f}",
                         "rounding of bf16 only" if fmt is None else f"{100 * err:.2f}%"])
    formula = 2 * (p - 1) * n * 2 // p
    return (_table(["algorithm", "on the wire", "bytes sent per device", "vs bf16 ring",
                    "predicted relative error"], rows)
            + f"\n\n*`eq.wire_bytes(n={n:,}, p={p}, fmt=..., algorithm=..., dtype=\"bfloat16\")` "
            f"and `eq.predicted_relative_error(fmt, algorithm, p)`, computed when this site was "
            f"built. The ring formula 2(p − 1)/p · n · 2 bytes gives {formula:,} for the bf16 "
            f"ring.*")



@generator("error-model")
def _gen_error_model() -> str:
    """Concepts: predicted int8 error of every algorithm for several device counts."""
    import equarx_ref as eq

    fmt, ps = eq.Format.int8(), [2, 4, 8, 16, 64, 256]
    rows = [[f"`{alg}`"] + [f"{eq.predicted_relative_error(fmt, alg, p):.2%}" for p in ps]
            for alg in ("ring", "bidir_ring", "two_shot", "one_shot")]
    return (_table(["algorithm"] + [f"p = {p}" for p in ps], rows)
            + "\n\n*`eq.predicted_relative_error(eq.Format.int8(), algorithm, p)`, computed "
            "when this site was built.*")



@generator("schedules")
def _gen_schedules() -> str:
    """Concepts: the schedules drawn by the package's own figure code."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    import equarx_ref as eq

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.4), gridspec_kw={"width_ratios": [4, 4.5, 2.4]})
    for ax, sched in zip(axes, (eq.ring_schedule(4), eq.bidir_ring_schedule(4),
                                eq.two_shot_schedule(4)), strict=True):
        eq.viz.draw_schedule(sched, ax=ax)
    fig.tight_layout()
    FIGURES.setdefault("assets/concepts/schedules.png", _png(fig))
    return ("![Ring, bidirectional ring and two-shot schedules on 4 devices]"
            "(assets/concepts/schedules.png)\n\n*Drawn by `eq.viz.draw_schedule` from "
            "`eq.ring_schedule(4)`, `eq.bidir_ring_schedule(4)` and `eq.two_shot_schedule(4)`: "
            "one row per device, one column per step, each cell what that device sends then "
            "(\"c3 → 1\": its copy of chunk 3, to device 1; \"→ 3\" in a collective: to 3 "
            "devices).*")

@generator("install")
def _gen_install() -> str:
    return f'```bash\npip install "equarx-ref @ git+{repo_url()}"\n```'


# ---------------------------------------------------------------------------- command outputs

# Each data file is the verbatim output of one command, run from the repository root. The pages
# print the command beside what it made; `python docs/hooks.py refresh [FILE...]` reruns them.
COMMANDS = {
    "demo.json": "equarx-ref demo --json docs/data/demo.json",
    "bench.json": "equarx-ref bench --json docs/data/bench.json",
    "gemma.json": "equarx-ref gemma --no-progress --json docs/data/gemma.json",
}


def _command(name: str) -> str:
    return f"```bash\n{COMMANDS[name]}\n```"


def _demo_rows() -> tuple[dict, list[dict]]:
    demo = _load("demo.json")
    return demo, demo["rows"]


def _fmt_err(r: dict, key: str) -> str:
    return "–" if (key == "predicted_error" and r["format"] == "bf16") else f"{r[key]:.2%}"


@generator("demo")
def _gen_demo() -> str:
    demo, rows = _demo_rows()
    table = _table(
        ["algorithm", "format", "bits", "bytes / device (HLO)", "fewer bytes", "rel. error",
         "theory", "CPU time"],
        [[r["algorithm"], r["format"] + (f" ({r['note']})" if r["note"] else ""),
          f"{r['bits_per_element']:g}", f"{r['bytes_sent']:,}", f"{r['byte_ratio']:.2f}x",
          _fmt_err(r, "rel_error"), _fmt_err(r, "predicted_error"), f"{r['time_ratio']:.2f}"]
         for r in rows])
    FIGURES.setdefault("assets/results/demo.png", _demo_figure(rows, both=True))
    return "\n".join([
        _command("demo.json"), "",
        f"{demo['devices']}; {demo['size']:,} bf16 values per device, N(0, 1), the same inputs "
        "for every row.", "",
        table, "",
        "- *bits*: per value on the wire, scales included; *bytes / device*: what one device "
        "sends, read from the compiled HLO (equal to `eq.wire_bytes`, except that XLA:CPU runs a "
        "bf16 `psum` in f32: \"CPU: f32\"); *fewer bytes*: the unquantized bf16 ring's bytes "
        "over these.",
        "- *rel. error*: ‖y − exact‖ / ‖exact‖ against the float64 sum of the inputs; "
        "*theory*: `eq.predicted_relative_error` (bf16 rows are not quantized: their error is "
        "the bf16 rounding of the partial sums).",
        "- *CPU time*: median wall time over the unquantized bf16 ring's, on simulated "
        "devices of one CPU, with no real links: it is not a TPU speed-up.", "",
        "![Bytes against error, and CPU time, for every row above]"
        "(assets/results/demo.png)", "",
    ])


def _demo_figure(rows: list[dict], both: bool) -> bytes:
    if both:  # the package's own figure for these rows
        from equarx_ref.benchmark import Row
        from equarx_ref.viz import plot_comparison

        return _png(plot_comparison([Row(**r) for r in rows]))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    markers = {"ring": "o", "bidir_ring": "^", "two_shot": "s", "one_shot": "v", "psum": "x"}
    colors: dict = {}
    for r in rows:
        if r["algorithm"] == "bidir_ring":
            continue  # same bytes and error as the ring
        c = colors.setdefault(r["format"], f"C{len(colors)}")
        ax.plot(1 / r["byte_ratio"], r["rel_error"], markers.get(r["algorithm"], "o"), color=c,
                ms=8, label=f"{r['format']} {r['algorithm']}")
    ax.set_xscale("log", base=2)
    ticks = [1 / 8, 1 / 4, 1 / 2, 1, 2, 4, 8]
    ax.set_xticks(ticks, [f"1/{round(1 / t)}" if t < 1 else f"{t:g}" for t in ticks])
    ax.set_yscale("log")
    ax.set_xlabel("bytes sent per device / bf16 ring")
    ax.set_ylabel("relative error")
    ax.set_title("bytes against error (lower left is better)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1))
    return _png(fig)


@generator("headline")
def _gen_headline() -> str:
    demo, rows = _demo_rows()
    by = {(r["algorithm"], r["format"]): r for r in rows}
    keep = [k for k in [("ring", "bf16"), ("ring", "int8"), ("two_shot", "int8"),
                        ("one_shot", "int8"), ("ring", "int4"), ("two_shot", "int4")] if k in by]
    table = _table(
        ["algorithm", "wire format", "bytes sent per device", "fewer bytes than bf16 ring",
         "relative error", "theory"],
        [[a, f, f"{by[a, f]['bytes_sent']:,}", f"{by[a, f]['byte_ratio']:.2f}x",
          f"{by[a, f]['rel_error']:.2%}",
          "–" if f == "bf16" else f"{by[a, f]['predicted_error']:.2%}"] for a, f in keep])
    FIGURES.setdefault("assets/results/headline.png", _demo_figure(rows, both=False))
    return "\n".join([
        "## Headline numbers", "",
        f"An AllReduce of {demo['size']:,} bf16 values per device on {demo['devices']}, every "
        "algorithm on the same inputs (all rows and the CPU timings on the "
        "[Results](results.md) page):", "",
        table, "",
        "![Bytes against error for every algorithm and format](assets/results/headline.png)",
        "", f"*Generated from the output of `{COMMANDS['demo.json']}`.*", "",
    ])



@generator("bench")
def _gen_bench() -> str:
    rows = _load("bench.json")
    table = _table(
        ["format", "array (MiB of f32)", "quantize + dequantize", "`x + 1` on the same array",
         "ratio", "GiB/s"],
        [[f"`{r['format']}`", r["mib"], f"{r['quantize_dequantize_s'] * 1e3:.1f} ms",
          f"{r['elementwise_s'] * 1e3:.1f} ms", f"{r['ratio']:.2f}x", f"{r['gib_per_s']:.2f}"]
         for r in rows])
    return "\n".join([
        _command("bench.json"), "", table, "",
        "*CPU wall times (median of the repeats), the quantizer and a plain elementwise pass "
        "measured side by side in the same run: the ratio is what the table is for, the "
        "absolute times depend on the machine that ran it.*", ""])



def _gemma_table(report: dict, keep=None) -> str:
    rows = [r for r in report["rows"] if keep is None or (r["algorithm"], r["format"]) in keep]
    return _table(
        ["algorithm", "format", "NLL", "perplexity", "ΔNLL (nats / token)", "KL mean",
         "top-1 agreement", "AllReduce error (attn / mlp)"],
        [[r["algorithm"], r["label"].split(" ", 1)[1], f"{r['mean_nll']:.4f}", f"{r['ppl']:.2f}",
          f"{r['dnll']:+.4f}", f"{r['kl_mean']:.1e}", f"{r['top1']:.1f}%",
          f"{r['site_err_attn_mean']:.2%} / {r['site_err_mlp_mean']:.2%}"] for r in rows])


def _gemma_setting(m: dict) -> str:
    return (f"{m['model']}, real weights, float32, tensor parallel over {m['tp']} devices, "
            f"{m['scored']:,} scored tokens of `{m['text']}`. The exact run (f32 `psum`) has a "
            f"mean NLL of {m['exact_mean_nll']:.4f} nats per token (perplexity "
            f"{m['exact_ppl']:.2f}); every other run is compared with it token by token.")


@generator("gemma")
def _gen_gemma() -> str:
    import matplotlib

    matplotlib.use("Agg")
    from equarx_ref.gemma.quality import plot_report

    report = _load("gemma.json")
    FIGURES.setdefault("assets/results/gemma.png", _png(plot_report(report)))
    return "\n".join([
        _command("gemma.json"), "", _gemma_setting(report["meta"]), "",
        _gemma_table(report), "",
        "- *ΔNLL*: mean negative log-likelihood minus the exact run's; *KL mean*: mean KL "
        "divergence of the next-token distributions from the exact run's; *top-1 agreement*: "
        "how often the most likely next token is the exact run's (it flips where the top two "
        "are close: compare with the bf16 rows, the noise floor).",
        "- *AllReduce error*: ‖AllReduce(partial sums) − exact sum‖ / ‖exact sum‖ at the "
        "attention and MLP AllReduce sites, on the exact run's partial sums, mean over layers.",
        "- The bf16 `psum` runs in f32 on XLA:CPU (\"CPU: f32\").", "",
        "![dNLL, top-1 agreement and AllReduce error per layer for every run]"
        "(assets/results/gemma.png)", ""])


@generator("gemma-headline")
def _gen_gemma_headline() -> str:
    report = _load("gemma.json")
    keep = {("ring", "bf16"), ("ring", "int8"), ("two_shot", "int8"), ("one_shot", "int8"),
            ("ring", "int4")}
    m = report["meta"]
    return "\n".join([
        f"And on a real model: {m['model']} with its two AllReduces per layer replaced, tensor "
        f"parallel over {m['tp']} devices, {m['scored']:,} tokens scored against the exact run "
        f"(all rows on the [Results](results.md) page):", "",
        _gemma_table(report, keep), "",
        f"*Generated from the output of `{COMMANDS['gemma.json']}`.*", ""])

def refresh(names: list[str]) -> None:
    """Rerun the commands behind docs/data/*.json (all of them, or the files named)."""
    import shlex
    import shutil
    import subprocess
    import sys

    for name in names or list(COMMANDS):
        print(f"$ {COMMANDS[name]}", flush=True)
        argv = shlex.split(COMMANDS[name])
        local = Path(sys.executable).parent / argv[0]  # this environment's script first
        argv[0] = str(local) if local.exists() else shutil.which(argv[0]) or argv[0]
        subprocess.run(argv, cwd=ROOT, check=True)


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["refresh"]:
        raise SystemExit("usage: python docs/hooks.py refresh [demo.json ...]")
    refresh(sys.argv[2:])
