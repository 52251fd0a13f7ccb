"""The command line, the devices, the figures: what a user runs first."""

import json

import jax
import pytest

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import cli
from equarx_ref.viz import draw_schedule


def test_setup_devices():
    assert len(DEVICES) == 8 and DEVICES[0].platform == "cpu"
    assert eq.setup_devices(4) == DEVICES[:4]
    assert eq.describe_devices(DEVICES).startswith("8 simulated CPU devices")
    with pytest.raises(RuntimeError, match="setup_devices"):
        eq.setup_devices(len(jax.devices("cpu")) + 1)
    with pytest.raises(ValueError, match=r"setup_devices\(n\): n must be >= 1"):
        eq.setup_devices(0)


def test_demo_json(tmp_path, capsys):
    out = tmp_path / "demo.json"
    assert cli.main(["demo", "--size", "4096", "--repeats", "1", "--json", str(out),
                     "--plot", str(tmp_path / "demo.png")]) == 0
    report = json.loads(out.read_text())
    rows = {(r["algorithm"], r["format"]): r for r in report["rows"]}
    assert len(rows) == 1 + 4 * 4  # psum (bf16 only) + 4 algorithms x 4 formats
    for (algorithm, fmt), r in rows.items():
        if algorithm != "psum":
            assert r["bytes_sent"] == r["bytes_model"], (algorithm, fmt)
        if fmt != "bf16":
            assert 0.8 < r["rel_error"] / r["predicted_error"] < 1.25, (algorithm, fmt)
    assert rows["psum", "bf16"]["note"] == "CPU: f32"
    assert rows["ring", "int8"]["byte_ratio"] == pytest.approx(16 / 8.5, rel=0.01)
    assert rows["ring", "int4"]["bits_per_element"] == 4.5
    assert rows["ring", "bf16"]["time_ratio"] == 1.0
    assert (tmp_path / "demo.png").stat().st_size > 10_000
    table = capsys.readouterr().out
    assert "bidir_ring" in table and "1.88x" in table


def test_bench(capsys):
    assert cli.main(["bench", "--mib", "4", "--repeats", "1"]) == 0
    table = capsys.readouterr().out
    assert "int8" in table and "mxfp4" in table and "x + 1" in table


def test_draw_schedule():
    ax = draw_schedule(eq.ring_schedule(4))
    labels = [t.get_text() for t in ax.texts]
    assert "c3 → 1" in labels  # step 0: device 0 sends chunk 3 to device 1
    assert sum("all-gather" in s for s in labels) == 4
    ax = draw_schedule(eq.bidir_ring_schedule(3))
    assert "c2 → 1\nc4 → 2" in [t.get_text() for t in ax.texts]  # two directions at once
