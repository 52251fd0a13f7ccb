"""The quality report of `quality.evaluate` as a fixed-width text table (what the CLI prints).

One line per run: mean NLL and perplexity, dNLL against the exact run with its paired standard
error, the mean KL and top-1 agreement, and the mean relative error of the two AllReduce sites.
A run whose |dNLL| is under two standard errors is marked "~": its effect on the loss is within
the noise of this text, so the sign and size of its dNLL mean nothing on their own.
"""

from __future__ import annotations

__all__ = ["format_table"]


def format_table(report: dict) -> str:
    """The report as a fixed-width text table."""
    m = report["meta"]
    prec = f", matmuls at {m['precision']} precision" if "precision" in m else ""
    head = (f"{m['model']}, TP={m['tp']}, {m['scored']} scored tokens{prec}; exact run (psum "
            f"f32): mean NLL {m['exact_mean_nll']:.4f}, perplexity {m['exact_ppl']:.3f}")
    w = max([26, *(len(r["label"]) + 2 for r in report["rows"])])       # the run column
    cols = (f"{'run':<{w}}{'NLL':>8}{'ppl':>9}{'dNLL +- SE':>22}{'KL mean':>10}{'top-1 %':>9}"
            f"{'err attn':>10}{'err mlp':>10}")
    lines = [head, "", cols, "-" * len(cols)]
    for r in report["rows"]:
        noise = "~" if r["within_noise"] else " "
        dnll = f"{r['dnll']:+.4f} +- {r['dnll_se']:.4f} {noise}"
        lines.append(f"{r['label']:<{w}}{r['mean_nll']:>8.4f}{r['ppl']:>9.3f}{dnll:>22}"
                     f"{r['kl_mean']:>10.2e}{r['top1']:>9.2f}{r['site_err_attn_mean']:>10.2e}"
                     f"{r['site_err_mlp_mean']:>10.2e}")
    lines += ["",
              "dNLL, KL, top-1: against the exact run, token by token. SE: paired standard error "
              "of dNLL over the scored tokens; ~: within noise (|dNLL| < 2 SE).",
              "err: ||AR(parts) - sum|| / ||sum|| per site on the exact run's partial sums, "
              "mean over layers."]
    return "\n".join(lines)
