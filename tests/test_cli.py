"""The command line, the devices, the figures: what a user runs first."""

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import equarx_ref as eq
from conftest import DEVICES
from equarx_ref import cli
from equarx_ref import spec as ref
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
    # The demo's inputs (runs.demo.compare_collectives, seed 0): N(0, 1) rounded to bf16. Every
    # error it reports must be the error of the documented all_reduce on them (the NumPy
    # reference), every prediction the model's, every time ratio its time over the bf16 ring's.
    x = np.asarray(jax.random.normal(jax.random.key(0), (8, 4096), jnp.float32)
                   .astype(jnp.bfloat16))
    exact = x.astype(np.float64).sum(0)
    base = rows["ring", "bf16"]
    for (algorithm, name), r in rows.items():
        fmt = eq.parse_format(name)
        assert r["predicted_error"] == eq.predicted_relative_error(8, fmt=fmt,
                                                                   algorithm=algorithm)
        assert r["cpu_time_s"] > 0 and r["time_ratio"] == pytest.approx(
            r["cpu_time_s"] / base["cpu_time_s"], rel=1e-12)
        if algorithm == "psum":  # f32 sums rounded once to bf16: within 2^-9 relative
            assert r["rel_error"] <= 2.0**-9 and r["note"] == "CPU: f32"
            continue
        y = ref.all_reduce(x, eq.make_schedule(algorithm, (8,)), fmt).astype(np.float64)
        assert r["rel_error"] == pytest.approx(
            np.linalg.norm(y - exact) / np.linalg.norm(exact), rel=1e-9), (algorithm, name)
        assert r["max_error"] == pytest.approx(np.abs(y - exact).max(), rel=1e-9)
        assert r["bytes_sent"] == r["bytes_model"] == eq.wire_bytes(
            4096, 8, fmt=fmt, algorithm=algorithm, dtype="bfloat16"), (algorithm, name)
        assert r["bits_per_element"] == (16 if fmt is None else fmt.bits_per_element)
    assert rows["ring", "int8"]["byte_ratio"] == pytest.approx(16 / 8.5, rel=0.01)
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


def test_cli_check_is_bitwise_the_spec(capsys, tmp_path):
    """`equarx-ref check` on this CPU: every format and data class, and the all_reduce cases,
    bitwise the spec; one table, one verdict, status 0."""
    out = tmp_path / "check.json"
    assert cli.main(["check", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "bitwise equal to the spec on CPU: 9 formats, 12 data classes" in text, text
    assert json.loads(out.read_text())["equal"] is True


def test_cli_check_shows_the_first_differing_block(capsys, monkeypatch):
    """One bit flipped in the codec's bytes: status 1, and the block that differs is shown with
    its values, the expected and the received bytes."""
    from equarx_ref.runs import check
    from equarx_ref.wire import to_bytes

    def flipped(q):
        buf = to_bytes(q)
        return buf.at[..., 3].set(buf[..., 3] ^ 1)  # one bit of block 0's payload

    monkeypatch.setattr(check, "to_bytes", flipped)
    monkeypatch.setattr(check, "_codec", functools.cache(check._codec.__wrapped__))
    assert cli.main(["check"]) == 1
    text = capsys.readouterr().out
    assert "NOT bitwise equal to the spec on CPU" in text, text
    assert "first difference: int8, gaussian, by to_bytes(quantize(x))" in text, text
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()}
    assert lines["block"].endswith(" 0")
    expected = json.loads(lines["expected"].split(":", 1)[1])
    got = json.loads(lines["got"].split(":", 1)[1])
    xor = [e ^ g for e, g in zip(expected, got, strict=True)]
    assert xor == [0, 0, 0, 1] + [0] * (len(got) - 4), xor
    assert "values" in lines
