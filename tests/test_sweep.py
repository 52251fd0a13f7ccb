"""`equarx-ref sweep` and `sweep.sweep`: a tiny map, its fields, its Pareto front, its JSON."""

import json

import matplotlib
import pytest

import equarx_ref as eq
from equarx_ref import cli
from equarx_ref.runs import sweep

matplotlib.use("Agg")

TINY = {"p_values": (2, 4), "algorithms": ("ring", "two_shot"), "formats": ("int8", "mxfp6_e2m3"),
        "remedies": ("none", "adaptive"), "size": 2048}


@pytest.fixture(scope="module")
def tiny():
    return sweep.sweep(**TINY, progress=False)


@pytest.mark.slow
def test_points_cover_the_grid_and_say_what_they_are(tiny):
    pts = tiny["points"]
    # ring and two_shot x two formats x none, + adaptive for int8 on both: 6 per p and data set
    assert len(pts) == 2 * 6 * len(sweep.DATA)
    assert tiny["modelled"] is True and tiny["chip"] == "v5e"
    for q in pts:
        if q["format"] == "int8" and q["remedy"] == "none":
            assert q["bits_per_element"] == pytest.approx(8.5)
            n = TINY["size"]
            assert q["bytes_per_value"] == pytest.approx(eq.wire_bytes(
                n, q["p"], fmt=eq.Format.int8(), algorithm=q["algorithm"]) / n, rel=1e-4)
        if q["data"] == "gaussian" and q["predicted_error"] is not None:
            assert 0.85 < q["rel_error"] / q["predicted_error"] < 1.15, q
        assert q["bits_per_element"] <= 8.5 + 1e-9 and q["modelled_speedup"] > 0


def test_pareto_front(tiny):
    pts = tiny["points"]
    for q in pts:
        rivals = [r for r in pts if (r["p"], r["data"]) == (q["p"], q["data"])]
        dominated = any(r["bytes_per_value"] <= q["bytes_per_value"] and
                        r["rel_error"] < q["rel_error"] for r in rivals)
        assert q["pareto"] != dominated or not q["pareto"], q
    assert any(q["pareto"] for q in pts)


def test_outlier_data_has_its_outlier_features():
    x = sweep.make_data("outliers", 2, 640 * 64)
    rms = (x.reshape(2, 64, 640) ** 2).mean(axis=1) ** 0.5  # [device, feature]
    assert (rms > 10).sum(axis=1).tolist() == [10, 10]  # 640 / 64 features, 20x larger
    assert ((rms > 10)[0] == (rms > 10)[1]).all()  # the same features on every device
    with pytest.raises(ValueError, match="unknown data"):
        sweep.make_data("uniform", 2, 8)


def test_plot(tiny, tmp_path):
    fig = eq.viz.plot_sweep(tiny, str(tmp_path / "map.png"))
    assert (tmp_path / "map.png").stat().st_size > 10_000 and len(fig.axes) == 4


def test_cli_sweep_writes_json_with_its_command(tmp_path, capsys):
    out = tmp_path / "sweep.json"
    assert cli.main(["sweep", "--p", "2", "--algorithms", "ring", "--formats", "int4",
                     "--remedies", "none", "rotate", "--data", "outliers", "--size", "1280",
                     "--json", str(out), "--no-progress"]) == 0
    text = capsys.readouterr().out
    assert "outliers:" in text and "modelled" in text
    result = json.loads(out.read_text())
    assert result["command"].startswith("equarx-ref sweep --p 2 --algorithms ring")
    assert {q["remedy"] for q in result["points"]} == {"none", "rotate"}


def test_cli_sweep_refuses_bad_arguments(capsys):
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--formats", "int99"])
    assert "int99" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["sweep", "--remedies", "magic"])


def test_a_repeated_option_runs_once_and_unknown_data_is_refused_first(capsys):
    """Values repeated on the command line (`--p 2 2`, `--data gaussian gaussian`) measure
    each point once; unknown data is refused before the first measurement."""
    r = sweep.sweep([2, 2], ["ring"], ["int4", "int4"], ["none", "none"],
                    ["gaussian", "gaussian"], size=256, progress=False)
    assert len(r["points"]) == 1
    with pytest.raises(ValueError, match="unknown data 'cats'"):
        sweep.sweep([2], ["ring"], ["int4"], ["none"], ["cats"], size=256, progress=False)
