"""Beyond int8 on the site: the map (sweep.json) and static int4 (outliers.json).

`equarx-ref sweep` wrote equarx_ref/data/sweep.json: every device count x algorithm x format x
remedy on Gaussian inputs and on inputs with outlier features, bytes per value, relative error, the
Pareto front and a modelled speedup. `equarx-ref outliers` wrote equarx_ref/data/outliers.json: the
Gemma 3 quality table of static int4 with bf16 outlier features beside the dynamic formats,
bits and bytes per row, the calibration, per-feature ranges of a few sites, and an
outlier-count sweep. The figures are the package's own (`viz.plot_sweep`,
`viz.plot_feature_ranges`); every sentence that states a finding is computed from the data, so
a refreshed file cannot leave a stale claim behind.
"""

from __future__ import annotations

from .commands import command_block
from .common import Section, load, png, table

#: The device count the findings speak of (the largest stored one if it is absent).
FINDINGS_P = 8
#: Figures of the map on the Results page: device counts side by side in each.
FIGURE_P = ((2, 4), (8, 16))


# ---- the map -----------------------------------------------------------------------------


def _name(q: dict) -> str:
    return f"{q['algorithm']} {q['format']}" + ("" if q["remedy"] == "none" else
                                                f" +{q['remedy']}")


def _index(result: dict) -> dict:
    return {(q["p"], q["algorithm"], q["format"], q["remedy"], q["data"]): q
            for q in result["points"]}


def sweep_setting(result: dict) -> str:
    ps = sorted({q["p"] for q in result["points"]})
    return (f"{result['devices']}; {result['size']:,} f32 values per device; "
            f"{len(result['points'])} points. Data: `gaussian`, i.i.d. N(0, 1); `outliers`, the "
            "same with 1/64 of the features of a 640-wide hidden vector 20 times wider on every "
            "device (`equarx_ref.runs.sweep.make_data`). Speedup: modelled by the time model on "
            "one "
            f"{result['chip']} chip for a {result['message_bytes'] >> 20} MiB bf16 message, "
            "against the unquantized bidirectional ring (`cost.predicted_time`), not measured. "
            f"Device counts: {', '.join(map(str, ps))}.")


def sweep_table(result: dict, data: str) -> str:
    """One row per configuration: bits, bytes per value and speedup at the largest p, the
    error at every p ("*": on that p's Pareto front of bytes per value and error)."""
    ps = sorted({q["p"] for q in result["points"]})
    at = _index(result)
    configs = list(dict.fromkeys((q["algorithm"], q["format"], q["remedy"])
                                 for q in result["points"] if q["data"] == data))
    big = ps[-1]
    rows = []
    for alg, fmt, remedy in configs:
        cells = []
        for p in ps:
            q = at.get((p, alg, fmt, remedy, data))
            cells.append("–" if q is None else
                         f"{q['rel_error']:.2%}" + (" *" if q["pareto"] else ""))
        last = at.get((big, alg, fmt, remedy, data))
        rows.append([_name({"algorithm": alg, "format": fmt, "remedy": remedy}),
                     f"{last['bits_per_element']:g}", f"{last['bytes_per_value']:.3f}", *cells,
                     f"{last['modelled_speedup']:.2f}x"])
    return table(["configuration", f"bits / element (p={big})", f"bytes / value (p={big})",
                  *(f"error p={p}" for p in ps), f"{result['chip']} speedup (p={big}, modelled)"],
                 rows)


def sweep_findings(result: dict) -> list[str]:
    """What the map says, each sentence computed from it."""
    at = _index(result)
    ps = sorted({q["p"] for q in result["points"]})
    p = FINDINGS_P if FINDINGS_P in ps else ps[-1]

    def err(alg, fmt, remedy, data):
        q = at.get((p, alg, fmt, remedy, data))
        return None if q is None else q["rel_error"]

    out = []
    ring_bytes = [q for q in result["points"] if q["p"] == p and q["format"] == "int8"
                  and q["algorithm"] != "one_shot"]
    for data in dict.fromkeys(q["data"] for q in ring_bytes):
        best = min((q for q in ring_bytes if q["data"] == data), key=lambda q: q["rel_error"])
        ring = err("ring", "int8", "none", data)
        out.append(f"- {data}, p = {p}: the least error at the int8 ring's bytes is "
                   f"{_name(best)}, {best['rel_error']:.2%} (the plain ring: "
                   f"{ring:.2%})." if ring is not None else "")
    remedies = sorted({q["remedy"] for q in result["points"]
                       if q["algorithm"] == "ring" and q["format"] == "int8"} - {"none"})
    two = err("two_shot", "int8", "none", "gaussian")
    if two is not None and remedies:
        rings = {r: err("ring", "int8", r, "gaussian") for r in remedies}
        best = min(rings, key=rings.get)
        verdict = "reaches" if rings[best] <= two else "does not reach"
        name = _name({"algorithm": "ring", "format": "int8", "remedy": best})
        out.append(f"- Goal, a ring at ≤ 8.5 bits with two-shot's error at p = {p}: on Gaussian "
                   f"data the best ring ({name}, {rings[best]:.2%}) {verdict} two-shot's "
                   f"{two:.2%}.")
    int8 = [q for q in result["points"] if q["p"] == p and q["format"] == "int8"
            and q["data"] == "gaussian"]
    if int8:
        fast = max(int8, key=lambda q: q["modelled_speedup"])
        out.append(f"- The fastest int8 configuration in the time model at p = {p}: "
                   f"{_name(fast)}, {fast['modelled_speedup']:.2f}x over bf16 (modelled).")
    return [line for line in out if line]


def sweep_results() -> Section:
    """The Results page: command, setting, findings, both tables, the map."""
    result = load("sweep.json")
    figures, links = {}, []
    for group in FIGURE_P:
        pts = [q for q in result["points"] if q["p"] in group]
        if not pts:
            continue
        from equarx_ref.viz import plot_sweep

        path = f"assets/results/sweep-{'-'.join(map(str, group))}.png"
        figures[path] = png(plot_sweep({"points": pts}))
        links.append(f"![Relative error against bytes per value, p = "
                     f"{' and '.join(map(str, group))}]({path})")
    data = list(dict.fromkeys(q["data"] for q in result["points"]))
    parts = [command_block("sweep.json"), "", sweep_setting(result), "", *sweep_findings(result),
             "", *links, "", "*Drawn by `eq.viz.plot_sweep`, the figure `equarx-ref sweep "
             "--plot` saves: colour the format, marker the algorithm, hollow with a remedy; the "
             "line is the Pareto front.*", ""]
    for kind in data:
        parts += [f"**{kind}** (\"*\": on the Pareto front of that device count)", "",
                  sweep_table(result, kind), ""]
    parts += ["- *bits / element*: the bytes one device sends over those of the same algorithm "
              "unquantized in bf16, times 16 (a hop-aware plan's average); *bytes / value*: "
              "bytes one device sends over the message's values (one-shot sends `p − 1` "
              "messages).",
              "- Remedies: `sr` stochastic rounding (`key=`), `rotate` a randomized Hadamard "
              "rotation per block (`rotate=True`), `adaptive` hop-aware bit widths "
              "(`hop_bits=\"adaptive\"`); chapter 06 of the course measures them step by step.",
              ""]
    return Section("\n".join(parts), figures)


# ---- static int4 with bf16 outliers ------------------------------------------------------


def outliers_table(report: dict) -> str:
    rows = []
    for r in report["rows"]:
        hlo = "yes" if r["bytes_per_device"] == r["hlo_bytes_per_device"] else \
            f"no ({r['hlo_bytes_per_device']:,.0f})"
        rows.append([r["algorithm"], r["format"], f"{r['bits_per_value']:.4g}",
                     f"{r['bytes_per_device']:,}", hlo,
                     f"{r['dnll']:+.4f} ± {r['dnll_se']:.4f}" + (" ~" if r["within_noise"]
                                                                  else ""),
                     f"{r['kl_mean']:.1e}", f"{r['top1']:.1f}%",
                     f"{r['site_err_attn_mean']:.2%} / {r['site_err_mlp_mean']:.2%}"])
    return table(["algorithm", "format", "bits / value", "bytes / device", "= HLO",
                  "ΔNLL ± SE", "KL mean", "top-1", "AllReduce error (attn / mlp)"], rows)


def calibration_text(report: dict) -> str:
    c = report["calibration"]
    return (f"Calibration: {c['batches']} sequences of {c['seq']} tokens of `{c['text']}` "
            f"({c['tokens']:,} tokens, moving average m = {c['momentum']:.2g}), TP = "
            f"{c['devices']}; {c['outliers']} bf16 outlier features per site of "
            f"{c['features']} (E / 64); the widest feature's calibrated range is "
            f"{min(c['range_ratio']):.1f} to {max(c['range_ratio']):.1f} times the median "
            f"feature's, depending on the site ({c['sites']} sites).")


def _one_shot(report: dict) -> dict:
    return {r["format"]: r for r in report["rows"] if r["algorithm"] == "one_shot"}


def outliers_findings(report: dict) -> list[str]:
    """The goal and what the table says about it, computed from the report."""
    k = report["calibration"]["outliers"]
    rows = _one_shot(report)
    best, plain = rows.get(f"int4 static + {k} bf16"), rows.get("int4 static")
    out = []
    if best is not None:
        reached = "reached" if abs(best["dnll"]) <= 0.05 else "not reached"
        out.append(f"- Goal, static int4 + outliers within |ΔNLL| ≤ 0.05 of the exact run: "
                   f"**{reached}** (one-shot: {best['dnll']:+.4f} ± {best['dnll_se']:.4f} at "
                   f"{best['bits_per_value']:g} bits per value).")
    if best is not None and plain is not None:
        out.append(f"- The {k} bf16 features move ΔNLL from {plain['dnll']:+.4f} to "
                   f"{best['dnll']:+.4f} for {best['bits_per_value'] - plain['bits_per_value']:g}"
                   f" bits per value.")
    dyn = rows.get("int4")
    if best is not None and dyn is not None:
        out.append(f"- Dynamic int4 through the same one-shot (4.5 bits with its scales): "
                   f"ΔNLL {dyn['dnll']:+.4f}, AllReduce error {dyn['site_err_mlp_mean']:.2%} "
                   f"(MLP) against the static format's {best['site_err_mlp_mean']:.2%}.")
    sweep = report.get("outlier_sweep") or []
    if len(sweep) > 1:
        lo, hi = sweep[0], sweep[-1]
        out.append(f"- From {lo['outliers']} to "
                   f"{hi['outliers']} of them ({lo['bits_per_value']:g} to "
                   f"{hi['bits_per_value']:g} bits per value) the mean AllReduce error goes "
                   f"from {lo['site_err_mean']:.2%} to {hi['site_err_mean']:.2%}.")
    return out


def outlier_sweep_table(report: dict) -> str:
    return table(["bf16 features per site", "bits / value", "AllReduce error, mean", "max"],
                 [[r["outliers"], f"{r['bits_per_value']:.4g}", f"{r['site_err_mean']:.2%}",
                   f"{r['site_err_max']:.2%}"] for r in report["outlier_sweep"]])


def outliers_results() -> Section:
    """The Results page: command, setting, calibration, findings, tables, the ranges figure."""
    import matplotlib.pyplot as plt

    from equarx_ref.viz import plot_feature_ranges

    from .gemma import setting

    report = load("outliers.json")
    path = "assets/results/outlier-ranges.png"
    ax = plot_feature_ranges(report["ranges"])
    ax.set_title("Calibrated per-feature ranges of the partial sums at five sites")
    fig = ax.figure
    plt.tight_layout()
    return Section("\n".join([
        command_block("outliers.json"), "", setting(report["meta"]), "",
        calibration_text(report), "", *outliers_findings(report), "", outliers_table(report), "",
        "- *bits / value*: everything on the wire (static formats send no scales); *bytes / "
        "device*: one AllReduce of the scored text's `[tokens, 640]` partial sums, counted; "
        "*= HLO*: the same number read back from the compiled collective.",
        "- ΔNLL, KL, top-1 and AllReduce error as in the Gemma table above.", "",
        "Bits against error for more or fewer bf16 features (one-shot, the exact run's partial "
        "sums, every site):", "", outlier_sweep_table(report), "",
        f"![Per-feature ranges at five Gemma sites, widest first]({path})", "",
        "*Drawn by `eq.viz.plot_feature_ranges`; dots: the features kept in bf16.*", ""]),
        {path: png(fig)})

