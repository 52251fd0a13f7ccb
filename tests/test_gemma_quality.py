"""Quality of quantized TP communication on Gemma 3 270M: `equarx-ref gemma` end to end on a
short prefix of the evaluation text (the full 1080-token table takes minutes, not CI time)."""

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.cli import main
from equarx_ref.gemma.figures import plot_report
from equarx_ref.gemma.quality import Bf16AllReduce, collective
from equarx_ref.gemma.report import format_table
from equarx_ref.gemma.scoring import site_errors

REF = json.loads((Path(__file__).parent / "fixtures/gemma/hf_reference.json").read_text())


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma")
    rc = main(["gemma", "--tokens", "160", "--algorithms", "ring", "--formats", "bf16", "int8",
               "int4", "--json", str(out / "q.json"), "--plot", str(out / "q.png"),
               "--no-progress"])
    assert rc == 0 and (out / "q.png").stat().st_size > 10_000
    return json.loads((out / "q.json").read_text())


@pytest.mark.slow
def test_report_shape(report):
    m = report["meta"]
    assert (m["tp"], m["tokens"], m["scored"], m["precision"]) == (4, 160, 159, "highest")
    assert [(r["algorithm"], r["format"], r["label"]) for r in report["rows"]] == [
        ("ring", "bf16", "ring bf16"), ("ring", "int8", "ring int8"), ("ring", "int4", "ring int4")]
    for r in report["rows"]:
        assert len(r["site_err_attn"]) == len(r["site_err_mlp"]) == 18
        assert r["kl_mean"] >= 0 and r["ppl"] == pytest.approx(np.exp(r["mean_nll"]))
        assert r["dnll_se"] > 0 and r["within_noise"] == (abs(r["dnll"]) < 2 * r["dnll_se"])
    # The exact TP run is the reference model: transformers' NLL on the same 159 tokens.
    ref = float(np.mean(REF["nll"][:159]))
    assert abs(m["exact_mean_nll"] - ref) < 2e-4, (m["exact_mean_nll"], ref)


def test_quality_ordering(report):
    bf16, int8, int4 = report["rows"]
    # bf16 partial sums: the noise floor; int8: small; int4 on a ring: clearly, significantly worse.
    assert abs(bf16["dnll"]) < 5e-3 and bf16["top1"] >= 97
    assert abs(int8["dnll"]) < 0.02 and int8["top1"] >= 90
    assert int4["dnll"] > 10 * abs(int8["dnll"]) and int4["top1"] < int8["top1"]
    assert not int4["within_noise"] and int4["dnll"] > 5 * int4["dnll_se"]
    assert bf16["kl_mean"] < int8["kl_mean"] < int4["kl_mean"]
    for site in ("site_err_attn_mean", "site_err_mlp_mean"):
        assert bf16[site] < int8[site] < int4[site]
        assert 5e-3 < int8[site] < 3e-2, int8[site]       # ~0.5 step of int8 per hop on 4 ranks


def test_table_lists_every_run(report):
    table = format_table(report)
    assert "ring int8" in table and "ring int4" in table and "perplexity" in table
    int4 = report["rows"][2]
    assert f"{int4['dnll']:+.4f} +- {int4['dnll_se']:.4f}" in table


def test_table_marks_differences_within_noise():
    row = {"algorithm": "ring", "format": "int8", "mean_nll": 3.0, "ppl": 20.0, "kl_mean": 1e-3,
           "top1": 95.0, "site_err_attn_mean": 1e-2, "site_err_mlp_mean": 1e-2}
    meta = {"model": "m", "tp": 4, "scored": 100, "exact_mean_nll": 3.0, "exact_ppl": 20.0}
    rows = [dict(row, label="noisy", dnll=0.003, dnll_se=0.002, within_noise=True),
            dict(row, label="clear", dnll=0.030, dnll_se=0.002, within_noise=False)]
    lines = {ln.split()[0]: ln for ln in format_table({"meta": meta, "rows": rows}).splitlines()
             if ln.startswith(("noisy", "clear"))}
    assert "+0.0030 +- 0.0020 ~" in lines["noisy"] and " ~" not in lines["clear"]


def test_site_errors_are_zero_for_exact_psum():
    mesh = eq.make_mesh(DEVICES[:4], ("tp",))
    parts = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3, 1, 8, 64)), jnp.float32)
    exact = np.asarray(site_errors(parts, mesh, lambda x, a: lax.psum(x, a)))
    assert exact.shape == (3,) and (exact < 1e-6).all()
    q = np.asarray(site_errors(parts, mesh, collective("ring", "int8")))
    assert (q > 1e-3).all() and (q < 5e-2).all()
    b = np.asarray(site_errors(parts, mesh, collective("ring", "bf16")))
    assert (b > 1e-4).all() and (b < q).all()                  # bf16 rounding, below int8


def test_collectives_of_the_report():
    assert collective("ring", "int8") == eq.AllReduce(fmt=eq.Format.int8(), algorithm="ring")
    assert collective("two_shot", eq.Format("int4", 16)) == \
        eq.AllReduce(fmt=eq.Format.int4(block_size=16), algorithm="two_shot")
    assert collective("psum", "bf16") == Bf16AllReduce("psum")
    assert hash(Bf16AllReduce("ring")) == hash(Bf16AllReduce("ring"))     # one compile
    assert str(Bf16AllReduce("bidir_ring")) == "bidir_ring bf16" and Bf16AllReduce().fmt is None
    with pytest.raises(ValueError, match="psum"):
        collective("psum", "int8")
    with pytest.raises(ValueError, match="unknown algorithm"):
        Bf16AllReduce("tree")
    with pytest.raises(ValueError):
        collective("ring", "int1")


@pytest.mark.parametrize("argv,message", [
    (["--tp", "0"], "expected an integer >= 1, got '0'"),
    (["--tokens", "-1"], "expected an integer >= 3, got '-1'"),
    (["--formats", "int1"], "int1"),
    (["--algorithms", "tree"], "invalid choice"),
    (["--precision", "tf32"], "invalid choice"),
])
def test_cli_bad_flags_exit_with_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        main(["gemma", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err and "Traceback" not in err


def test_cli_checks_outputs_before_working(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:  # refused while parsing, before any work
        main(["gemma", "--json", str(tmp_path / "missing" / "q.json"), "--no-progress"])
    assert e.value.code == 2 and "cannot write" in capsys.readouterr().err


def test_cli_tp_the_model_cannot_split(capsys):
    with pytest.raises(SystemExit) as e:  # refused while parsing, before the weights load
        main(["gemma", "--tp", "3", "--tokens", "8", "--no-progress"])
    from conftest import cli_error

    err = cli_error(capsys.readouterr().err)
    assert e.value.code == 2 and "4 query heads do not split over 3 devices" in err, err


@pytest.mark.slow
def test_plot_report(report):
    import matplotlib
    matplotlib.use("Agg")
    fig = plot_report(report)
    assert len(fig.axes) == 3
    assert len(fig.axes[0].patches) == len(report["rows"])
