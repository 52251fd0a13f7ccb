"""Beyond int8 on the site: viz.plot_feature_ranges and docs/gen/beyond.py.

The figure is checked against a plain computation of what it should draw (ranks, ratios to the
median, marked features); the generators on small hand-made results whose findings are known,
so that a finding sentence flips when the data does; the Results page's tables against the stored
JSON, read independently; and every stored file's command against the one the docs name.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import matplotlib
import pytest

matplotlib.use("Agg")

from test_docs import _docs_gen as _gen  # tests/ is on the path
from test_docs import _results_section

ROOT = Path(__file__).resolve().parent.parent




def test_plot_feature_ranges_draws_sorted_ratios_and_marks_the_outliers():
    from equarx_ref.viz import plot_feature_ranges

    spread = [1.0, 8.0, 2.0, 2.0, 30.0, 3.0, 1.5]
    sites = [{"layer": 3, "kind": "mlp", "range": spread, "outliers": [4, 1]},
             {"label": "toy", "range": [2.0, 2.0, 4.0]}]
    ax = plot_feature_ranges(sites)
    lines = ax.get_lines()
    med = statistics.median(spread)
    want = sorted((v / med for v in spread), reverse=True)
    curve, dots = lines[0], lines[1]
    assert list(curve.get_xdata()) == list(range(1, len(spread) + 1))
    assert list(curve.get_ydata()) == pytest.approx(want)
    assert list(dots.get_xdata()) == [1, 2]  # features 4 (30.0) and 1 (8.0): ranks 1 and 2
    assert list(dots.get_ydata()) == pytest.approx([30 / med, 8 / med])
    assert list(lines[3].get_xdata()) == []  # the second site marks nothing
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == [f"layer 3 mlp (widest {30 / med:.1f}x)", "toy (widest 2.0x)"]
    assert ax.get_xscale() == ax.get_yscale() == "log"


@pytest.mark.parametrize("site, message", [({"label": "a", "range": []}, "no feature ranges"),
                                           ({"label": "a", "range": [0.0, 0.0, 1.0]},
                                            "median range")])
def test_plot_feature_ranges_refuses_what_it_cannot_draw(site, message):
    from equarx_ref.viz import plot_feature_ranges

    with pytest.raises(ValueError, match=message):
        plot_feature_ranges([site])


def _point(p, alg, fmt, remedy, data, err, speedup=1.0, bpv=1.859, pareto=False):
    return {"p": p, "algorithm": alg, "format": fmt, "remedy": remedy, "data": data,
            "bits_per_element": 8.5, "bytes_per_value": bpv, "rel_error": err,
            "predicted_error": None, "modelled_speedup": speedup, "pareto": pareto}


def _sweep(adaptive_error: float) -> dict:
    pts = []
    for data, scale in (("gaussian", 1.0), ("outliers", 2.0)):
        pts += [_point(8, "ring", "int8", "none", data, 0.0117 * scale, 1.16),
                _point(8, "ring", "int8", "adaptive", data, adaptive_error * scale, 1.16),
                _point(8, "bidir_ring", "int8", "none", data, 0.0116 * scale, 1.55),
                _point(8, "two_shot", "int8", "none", data, 0.0077 * scale, 1.05, pareto=True),
                _point(8, "one_shot", "int8", "none", data, 0.0001, 0.47, bpv=7.4)]
    return {"points": pts, "size": 16384, "chip": "v5e", "message_bytes": 16 << 20,
            "devices": "8 simulated CPU devices"}


def test_sweep_findings_follow_the_data():
    beyond = _gen("beyond")
    missed = "\n".join(beyond.sweep_findings(_sweep(0.0093)))
    assert "does not reach two-shot's 0.77%" in missed, missed
    assert "least error at the int8 ring's bytes is two_shot int8, 0.77%" in missed
    assert "bidir_ring int8, 1.55x" in missed
    assert "one_shot" not in missed  # one-shot sends more bytes: not a rival at the ring's
    reached = "\n".join(beyond.sweep_findings(_sweep(0.0070)))
    assert "(ring int8 +adaptive, 0.70%) reaches two-shot's 0.77%" in reached, reached


def test_sweep_table_has_one_row_per_configuration_and_marks_the_front():
    beyond = _gen("beyond")
    text = beyond.sweep_table(_sweep(0.0093), "gaussian")
    rows = text.splitlines()[2:]
    assert len(rows) == 5
    assert "| two_shot int8 | 8.5 | 1.859 | 0.77% * | 1.05x |" in rows


def _report(static_dnll: float) -> dict:
    def row(alg, fmt, dnll, err, bits):
        return {"algorithm": alg, "format": fmt, "dnll": dnll, "dnll_se": 0.01,
                "within_noise": abs(dnll) < 0.02, "site_err_mlp_mean": err,
                "bits_per_value": bits}
    return {"meta": {"model": "Gemma 3 270m", "tp": 4},
            "calibration": {"outliers": 10},
            "rows": [row("one_shot", "int8", -0.001, 0.008, 8.5),
                     row("one_shot", "int4", 0.25, 0.113, 4.5),
                     row("one_shot", "int4 static", 0.38, 0.104, 4.0),
                     row("one_shot", "int4 static + 10 bf16", static_dnll, 0.094, 4.1875)],
            "outlier_sweep": [{"outliers": 0, "bits_per_value": 4.0, "site_err_mean": 0.103},
                              {"outliers": 160, "bits_per_value": 7.0, "site_err_mean": 0.075}]}


def test_outlier_findings_state_the_goal_from_the_data():
    beyond = _gen("beyond")
    assert "**not reached**" in beyond.outliers_findings(_report(0.32))[0]
    assert "**reached**" in beyond.outliers_findings(_report(-0.04))[0]
    text = "\n".join(beyond.outliers_findings(_report(0.32)))
    assert "from +0.3800 to +0.3200 for 0.1875 bits" in text
    assert "from 10.30% to 7.50%" in text


def _data(name: str):
    """A stored result (equarx_ref/data/NAME), as the package ships it."""
    from equarx_ref import data

    return data.load(name.removesuffix(".json"))


def test_every_stored_command_is_the_one_the_docs_name():
    commands = _gen("commands").COMMANDS
    for name, command in commands.items():
        data = _data(name)
        if isinstance(data, dict) and "command" in data:
            assert data["command"] == command, f"equarx_ref/data/{name} was made by another command"
    assert "sweep.json" in commands and "outliers.json" in commands


@pytest.mark.slow
def test_results_beyond_tables_agree_with_the_json():
    """Read independently of the generator: the Results page's map rows (errors at every device
    count, on each kind of data) and static int4 rows carry the stored numbers."""
    at = {(q["p"], q["algorithm"], q["format"], q["remedy"], q["data"]): q
          for q in _data("sweep.json")["points"]}
    ps = sorted({k[0] for k in at})
    section = _results_section("Beyond int8")
    checked = 0
    for kind in ("gaussian", "outliers"):
        block = section.split(f"**{kind}**", 1)[1].split("\n\n", 2)[1]  # the table after it
        for line in block.splitlines()[2:]:
            cells = [c.strip() for c in line.strip("|").split("|")]
            alg, fmt, *rest = cells[0].split()
            remedy = rest[0].lstrip("+") if rest else "none"
            for p, cell in zip(ps, cells[3:3 + len(ps)], strict=True):
                q = at.get((p, alg, fmt, remedy, kind))
                assert cell.rstrip(" *") == ("–" if q is None else f"{q['rel_error']:.2%}"), (
                    kind, cells[0], p, cell)
                checked += q is not None
    assert checked == len(at), f"the map shows {checked} of {len(at)} stored points"
    report = _data("outliers.json")
    block = _results_section("Static int4")
    best = next(r for r in report["rows"] if r["algorithm"] == "one_shot"
                and r["format"] == f"int4 static + {report['calibration']['outliers']} bf16")
    assert f"{best['dnll']:+.4f} ± {best['dnll_se']:.4f}" in block
    assert ("**not reached**" in block) == (abs(best["dnll"]) > 0.05)
