"""The README's generated blocks: its headline, made from equarx_ref/data/*.json like the site's
Results page (which has every table; the README has one and a few figures beside it).

The README marks each generated block `<!-- gen:readme-NAME -->` ... `<!-- /gen:readme-NAME -->`;
`render` fills every block from the stored data, `python docs/hooks.py readme` writes the result
(`refresh` does it after rerunning the commands) and tests/test_docs.py checks that the README
equals its rendering, so its numbers are the data's.
"""

from __future__ import annotations

import re
from collections import Counter

from . import demo, model, multihost
from .commands import COMMANDS
from .common import ROOT, load

README = ROOT / "README.md"
BLOCK = re.compile(r"(<!-- gen:readme-([a-z0-9-]+) -->\n)(.*?)(<!-- /gen:readme-\2 -->)", re.S)

#: The message of the headline's modelled TPU speedup (bytes of bf16).
MODEL_MESSAGE = 16 << 20
#: The headline's measured run (its link) and Gemma run (algorithm, format).
MEASURED_LINK = "100mbit"
GEMMA_RUN = ("ring", "int8")


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"


def _headline() -> str:
    """The demo's headline rows, then one line each: quality on Gemma, time modelled on a TPU,
    time measured on capped links."""
    data, rows = demo.rows()
    lines = [
        f"`{COMMANDS['demo.json']}`: {demo.setting(data)} Bytes are read from the compiled HLO; "
        "the error is against the exact float64 sum, beside the error model's prediction:", "",
        demo.headline_table(rows), "", _quality(), _modelled()]
    measured = _measured()
    return "\n".join(lines + ([measured] if measured else [])) + "\n"


def _quality() -> str:
    report = load("gemma.json")
    m = report["meta"]
    g = next(r for r in report["rows"] if (r["algorithm"], r["format"]) == GEMMA_RUN)
    return (f"- **Quality**: {m['model']} at TP = {m['tp']} with every AllReduce an "
            f"{GEMMA_RUN[1]} {GEMMA_RUN[0]}: ΔNLL {g['dnll']:+.4f} ± {g['dnll_se']:.4f} nats per "
            f"token, top-1 agreement {g['top1']:.1f}% with the exact run (`equarx-ref gemma`).")


def _modelled() -> str:
    report = load(model.FILE)
    r = next(r for r in report["rows"] if r["message_bytes"] == MODEL_MESSAGE)
    prefill = report["prefill"]
    return (f"- **Time, modelled** for TPU {report['chip']} ({report['devices']} chips, "
            f"`{report['algorithm']}`; public chip figures and libtpu's static schedule of the "
            "codec's kernels, not a measurement): int8 "
            f"{r['int8_speedup']:.2f}x and int4 {r['int4_speedup']:.2f}x faster than bf16 at "
            f"{_mib(MODEL_MESSAGE)}; " + " / ".join(p["model"] for p in prefill) +
            f" prefill at TP = {prefill[0]['tp']}: " +
            " / ".join(f"{p['speedup']:.2f}x" for p in prefill) + " (the paper, measured: " +
            " / ".join(model.PAPER_PREFILL.get(p["model"], "–") for p in prefill) +
            "; `equarx-ref model`).")


def _measured() -> str | None:
    run = next((r for r in multihost.runs() if r.get("link") == MEASURED_LINK), None)
    if run is None:
        return None
    at = {(r["algorithm"], r["format"]): r for r in run["results"]
          if r["message_bytes"] == multihost.TARGET_MIB << 20}
    return (f"- **Time, measured** (CPU timings): {run['hosts']} processes over {MEASURED_LINK} "
            f"rate-capped links, the ring at {multihost.TARGET_MIB} MiB: " +
            ", ".join(f"{f} {at['ring', f]['speedup_vs_bf16']:.2f}x" for f in ("int8", "int4")
                      if ("ring", f) in at) +
            " faster than the bf16 ring (`equarx-ref bench --hosts`).")


def _compiled() -> str:
    """What libtpu compiles for the TPUs it targets, from its record (no TPU ran it)."""
    record = load("tpu.json")
    ok = Counter(r["topology"] for r in record["results"] if r["ok"])
    every = Counter(r["topology"] for r in record["results"])
    chips = " and ".join(dict.fromkeys(t.split(":")[0] for t in every))
    return (f"- **What compiles for TPU {chips}**, from a CPU machine: libtpu " +
            record["libtpu"] + " (jax " + record["jax"] + "), deviceless: " +
            " and ".join(f"{ok[t]} of {every[t]} programs for {t}" for t in every) + " compile" +
            " (the collectives in every format, the Pallas ring and the codec kernels, "
            "Gemma 3's forward; "
            "`equarx_ref/data/tpu.json`).\n")


BLOCKS = {"headline": _headline, "compiled": _compiled}


def render(text: str) -> str:
    """`text` with every generated block made anew from the data."""
    def fill(m):
        if m.group(2) not in BLOCKS:
            raise KeyError(f"README: no block named {m.group(2)!r}; known: {sorted(BLOCKS)}")
        return m.group(1) + BLOCKS[m.group(2)]() + m.group(4)
    return BLOCK.sub(fill, text)


def update() -> bool:
    """Rewrite README.md's generated blocks; True if anything changed."""
    old = README.read_text(encoding="utf-8")
    new = render(old)
    if new != old:
        README.write_text(new, encoding="utf-8")
    return new != old
