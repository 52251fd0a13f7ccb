"""Quality of quantized TP communication on Gemma 3 270M: `equarx-ref gemma` end to end on a
short prefix of the evaluation text (the full 1080-token table takes minutes, not CI time)."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref.cli import main
from equarx_ref.gemma.quality import LossyAllReduce, format_table, plot_report, site_errors


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gemma")
    rc = main(["gemma", "--tokens", "160", "--algorithms", "ring", "--formats", "bf16", "int8",
               "int4", "--json", str(out / "q.json"), "--plot", str(out / "q.png"),
               "--no-progress"])
    assert rc == 0 and (out / "q.png").stat().st_size > 10_000
    return json.loads((out / "q.json").read_text())


def test_report_shape(report):
    m = report["meta"]
    assert (m["tp"], m["tokens"], m["scored"]) == (4, 160, 159)
    assert [(r["algorithm"], r["format"]) for r in report["rows"]] == \
        [("ring", "bf16"), ("ring", "int8"), ("ring", "int4")]
    for r in report["rows"]:
        assert len(r["site_err_attn"]) == len(r["site_err_mlp"]) == 18
        assert r["kl_mean"] >= 0 and r["ppl"] == pytest.approx(np.exp(r["mean_nll"]))
    assert 10 < m["exact_ppl"] < 60


def test_quality_ordering(report):
    bf16, int8, int4 = report["rows"]
    # bf16 partial sums: the noise floor; int8: negligible; int4 on a ring: clearly worse.
    assert abs(bf16["dnll"]) < 5e-3 and bf16["top1"] >= 97
    assert abs(int8["dnll"]) < 0.02 and int8["top1"] >= 90
    assert int4["dnll"] > 10 * abs(int8["dnll"]) and int4["top1"] < int8["top1"]
    for site in ("site_err_attn_mean", "site_err_mlp_mean"):
        assert bf16[site] < int8[site] < int4[site]
        assert 5e-3 < int8[site] < 3e-2, int8[site]       # ~0.5 step of int8 per hop on 4 ranks


def test_table_lists_every_run(report):
    table = format_table(report)
    assert "ring int8" in table and "ring int4" in table and "perplexity" in table


def test_site_errors_are_zero_for_exact_psum():
    mesh = eq.make_mesh(DEVICES[:4], ("tp",))
    parts = jnp.asarray(np.random.default_rng(0).standard_normal((4, 3, 1, 8, 64)), jnp.float32)
    exact = np.asarray(site_errors(parts, mesh, lambda x, a: lax.psum(x, a)))
    assert exact.shape == (3,) and (exact < 1e-6).all()
    q = np.asarray(site_errors(parts, mesh, LossyAllReduce("ring", "int8")))
    assert (q > 1e-3).all() and (q < 5e-2).all()


def test_lossy_all_reduce_validation():
    with pytest.raises(ValueError, match=r"psum is lax\.psum"):
        LossyAllReduce("psum", "int8")
    with pytest.raises(ValueError, match="unknown algorithm"):
        LossyAllReduce("tree", "int8")
    with pytest.raises(ValueError, match="unknown format"):
        LossyAllReduce("ring", "int2")
    assert LossyAllReduce("ring", "int8") == LossyAllReduce("ring", "int8")   # one compile


def test_plot_report(report):
    import matplotlib
    matplotlib.use("Agg")
    fig = plot_report(report)
    assert len(fig.axes) == 3
