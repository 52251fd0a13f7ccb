"""`equarx-ref gemma` on the site: quality of quantized AllReduce in Gemma 3, from gemma.json.

The report is what `equarx_ref.gemma.quality.evaluate` returns; its figure is the package's
own (`equarx_ref.gemma.figures.plot_report`). Each table column is one line of `COLUMNS`: a
header and a template over a row's fields (those of the JSON, plus `fields`' derived ones).
"""

from __future__ import annotations

from .commands import COMMANDS, command_block
from .common import Section, load, png, table

#: The Results page's table: (header, template over `fields(row)`). A new field of the report
#: is one more line here.
COLUMNS = [
    ("algorithm", "{algorithm}"),
    ("format", "{wire}"),
    ("NLL", "{mean_nll:.4f}"),
    ("perplexity", "{ppl:.2f}"),
    ("ΔNLL ± SE (nats / token)", "{dnll:+.4f} ± {dnll_se:.4f}{noise}"),
    ("KL mean", "{kl_mean:.1e}"),
    ("top-1 agreement", "{top1:.1f}%"),
    ("AllReduce error (attn / mlp)", "{site_err_attn_mean:.2%} / {site_err_mlp_mean:.2%}"),
]
#: The home page's rows: (algorithm, format).
HEADLINE = [("ring", "bf16"), ("ring", "int8"), ("two_shot", "int8"), ("one_shot", "int8"),
            ("ring", "int4")]


def note(row: dict) -> str:
    """What a row's label adds to its algorithm and format: " (CPU: f32)" for a psum on CPU."""
    return row["label"].removeprefix(f"{row['algorithm']} {row['format']}")


def fields(row: dict) -> dict:
    """A report row plus what the templates derive: `wire` (format and `note`) and `noise`
    (" ~" when the report marks |ΔNLL| < 2 SE: within noise)."""
    return {**row, "wire": row["format"] + note(row),
            "noise": " ~" if row["within_noise"] else ""}


def cell(template: str, row: dict) -> str:
    """`template` filled from `fields(row)`, or a clear error naming what the report lacks."""
    try:
        return template.format(**fields(row))
    except KeyError as e:
        raise KeyError(f"equarx_ref/data/gemma.json: its rows have no field {e}; rerun "
                       f"`{COMMANDS['gemma.json']}`") from None


def report_table(report: dict, keep=None) -> str:
    """The rows of `report` (those in `keep` if given) with every column of `COLUMNS`."""
    rows = [r for r in report["rows"] if keep is None or (r["algorithm"], r["format"]) in keep]
    return table([h for h, _ in COLUMNS], [[cell(t, r) for _, t in COLUMNS] for r in rows])


def setting(m: dict) -> str:
    return (f"{m['model']}, real weights, float32, tensor parallel over {m['tp']} devices, "
            f"{m['scored']:,} scored tokens of `{m['text']}`. The exact run (f32 `psum`) has a "
            f"mean NLL of {m['exact_mean_nll']:.4f} nats per token (perplexity "
            f"{m['exact_ppl']:.2f}); every other run is compared with it token by token.")


NOTES = [
    "- *ΔNLL*: mean negative log-likelihood minus the exact run's, ± its paired standard error "
    "over the scored tokens; \"~\": within noise (|ΔNLL| < 2 SE), so its sign and size mean "
    "nothing on their own.",
    "- *KL mean*: mean KL divergence of the next-token distributions from the exact run's; "
    "*top-1 agreement*: how often the most likely next token is the exact run's (it flips "
    "where the top two are close: compare with the bf16 rows, the noise floor).",
    "- *AllReduce error*: ‖AllReduce(partial sums) − exact sum‖ / ‖exact sum‖ at the "
    "attention and MLP AllReduce sites, on the exact run's partial sums, mean over layers.",
    "- The bf16 rows round the partial sums to bf16 and reduce them unquantized; the bf16 "
    "`psum` runs in f32 on XLA:CPU (\"CPU: f32\").",
]


def results() -> Section:
    """The Results page: the command, the setting, every row, the notes, the figure."""
    from equarx_ref.gemma.figures import plot_report

    report = load("gemma.json")
    path = "assets/results/gemma.png"
    return Section("\n".join([
        command_block("gemma.json"), "", setting(report["meta"]), "",
        report_table(report), "", *NOTES, "",
        f"![ΔNLL, top-1 agreement and AllReduce error per layer for every run]({path})", "",
        "*Drawn by `eq.gemma.figures.plot_report`, the figure `equarx-ref gemma --plot` "
        "saves.*", ""]), {path: png(narrow(plot_report(report)))})


def narrow(fig, width: float = 11.0):
    """`plot_report`'s figure made narrower (same content): its labels stay readable at the
    width of a page instead of being scaled down with a 16-inch-wide image."""
    fig.set_size_inches(width, 5.5)
    fig.tight_layout()
    return fig


def headline() -> Section:
    """The home page: a few runs on the real model."""
    report = load("gemma.json")
    m = report["meta"]
    return Section("\n".join([
        f"And on a real model: {m['model']} with its two AllReduces per layer replaced, tensor "
        f"parallel over {m['tp']} devices, {m['scored']:,} tokens scored against the exact run "
        f"(all rows on the [Results](results.md) page):", "",
        report_table(report, set(HEADLINE)), "",
        f"*Generated from the output of `{COMMANDS['gemma.json']}`.*", ""]))
