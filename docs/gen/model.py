"""`equarx-ref model` on the site: modelled TPU time, from model-v5e.json (the README's headline
quotes a row of it and `PAPER_PREFILL`).

The report is the command's JSON as it wrote it (`equarx_ref/models/cost.py` and
`equarx_ref/models/prefill.py` on one chip type): for messages of 1 KiB to 1 GiB the unquantized
time and the speedups of int8 and int4, each at its best pipeline depth; the crossover; Gemma 3
prefill at the given TP. Every figure in it is modelled, and the tables say so.
"""

from __future__ import annotations

from .commands import command_block
from .common import Section, load, png, table

FILE = "model-v5e.json"
#: Gemma 3 prefill speedups the EQuARX paper measured on TPUs, beside the modelled ones.
PAPER_PREFILL = {"Gemma 3 12B": "1.1x", "Gemma 3 27B": "1.25x"}


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.3g} {unit}"
    return f"{nbytes} B"


def _time(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.1f} µs"


def setting(report: dict) -> str:
    """Chip, ring, where its figures come from: one sentence."""
    from equarx_ref.models.cost import CHIPS

    chip = CHIPS[report["chip"]]
    return (f"{chip.name}, {report['devices']} chips in a ring ({report['algorithm']}), "
            f"**modelled** from public chip figures ({chip.source}), not measured.")


def speedup_table(report: dict) -> str:
    """One line per message size: bf16 time, int8 and int4 time, speedup and best depth k."""
    return table(
        ["message (bf16)", "bf16", "int8", "speedup", "k", "int4", "speedup", "k"],
        [[_size(r["message_bytes"]), _time(r["bf16_seconds"]), _time(r["int8_seconds"]),
          f"{r['int8_speedup']:.2f}x", r["int8_num_chunks"], _time(r["int4_seconds"]),
          f"{r['int4_speedup']:.2f}x", r["int4_num_chunks"]] for r in report["rows"]])


def crossover(report: dict) -> str:
    """The crossover sentence: where the quantized run starts to win, and why it is small."""
    sizes = ", ".join(f"{name} from {_size(b)}" for name, b in report["crossover_bytes"].items())
    return (f"Crossover (quantized faster): {sizes}. The chip figures carry no fixed cost of "
            "quantizing (no public figure exists), so only block padding loses; with a fixed "
            "cost per quantizing pass the crossover moves up to megabytes "
            "(`cost.crossover_bytes`, notebook 05). Below it `all_reduce(..., min_bytes=...)` "
            "sends the message unquantized.")


def prefill_table(report: dict) -> str:
    """Gemma 3 prefill: matmuls, AllReduces bf16 and int8, speedup, the paper's figure."""
    paper = PAPER_PREFILL
    return table(
        [f"prefill, {report['prefill'][0]['tokens']} tokens, TP={report['prefill'][0]['tp']}",
         "matmuls", "AllReduces bf16", "AllReduces int8", "speedup (modelled)",
         "paper (measured)"],
        [[r["model"], _time(r["compute_s"]), _time(r["bf16_allreduce_s"]),
          _time(r["int8_allreduce_s"]), f"{r['speedup']:.2f}x", paper.get(r["model"], "–")]
         for r in report["prefill"]])


def results() -> Section:
    """The Results page: the command, the speedup table and figure, crossover, prefill."""
    from equarx_ref.viz import plot_speedup

    report = load(FILE)
    path = "assets/results/model.png"
    ax = plot_speedup(report)
    return Section("\n".join([
        command_block(FILE), "", setting(report), "", speedup_table(report), "",
        "*k*: the pipeline depth (`num_chunks`) the model finds fastest for that message "
        "(`eq.best_num_chunks`). " + crossover(report), "",
        f"![Modelled speedup of int8 and int4 over bf16 against message size]({path})", "",
        "*Drawn by `eq.viz.plot_speedup` (what `equarx-ref model --plot` saves).*", "",
        prefill_table(report), "",
        "*Matmul FLOPs at 50% of the chip's peak plus two AllReduces per layer of 2048 x D "
        "values (`equarx_ref.models.prefill`); what the model leaves out (overlap, the paper's "
        "slice, TP and batch, fixed costs) is discussed in "
        "[notebook 05](notebooks/05_cost_and_pipelining.ipynb).*", ""]),
        {path: png(ax.figure)})

