"""The command line, the devices, the figures: what a user runs first."""

import functools
import json
import sys

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


@pytest.mark.slow
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


def _default():
    """The default backend's first device: where `bench` and `check` run (CPU here, the GPU
    or TPU where there is one)."""
    return jax.devices()[0]  # default backend on purpose


def _chip() -> str:
    """How `check`'s verdict names the default device ("CPU" on a CPU-only machine)."""
    from equarx_ref.cli.check import chip_name

    return chip_name(_default().device_kind, _default().platform)


@pytest.mark.slow
def test_bench(capsys, tmp_path):
    """`bench` prints and stores every program's row (timings are shown, never asserted: a
    benchmark, not a test of speed), with the fewest bytes of each program exact, and the
    site's tables render them."""
    from test_docs import _docs_gen  # tests/ is on the path

    from equarx_ref.runs.bench import BENCH_FORMATS, PROGRAMS, QDQ_FORMATS

    out = tmp_path / "bench.json"
    assert cli.main(["bench", "--mib", "1", "--repeats", "1", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    assert "int8" in table and "mxfp4" in table and "x + 1" in table and "of copy" in table
    result = json.loads(out.read_text())
    assert result["device"] and result["platform"] == _default().platform
    n = 1 << 19  # 1 MiB of bf16
    plain, plain32, add, *codec = result["codec"]
    assert [(r["program"], r["format"], r["fewest_bytes"]) for r in (plain, plain32, add)] == [
        ("x + 1", "bfloat16", 4 * n), ("x + 1", "float32", 4 * n), ("a + b", "bfloat16", 6 * n)]
    # the XLA path, then the kernels native to the chip: the Mosaic codec's on a TPU, the GPU
    # codec's (8-bit and 4-bit formats: every bench format) on a GPU, none on a CPU
    native = {"tpu": ("pallas", BENCH_FORMATS), "gpu": ("gpu", BENCH_FORMATS)}.get(
        _default().platform)
    paths = [("xla", BENCH_FORMATS), *([native] if native else [])]
    assert [(r["path"], r["program"], r["format"]) for r in codec] == [
        (path, p, str(eq.Format.parse(f))) for path, fs in paths for f in fs for p in PROGRAMS]
    for r in result["codec"]:
        wire = 0 if r["program"] in ("x + 1", "a + b") else eq.Format.parse(
            r["format"]).nbytes(n)
        assert r["fewest_bytes"] == {"x + 1": 4 * n, "a + b": 6 * n, "encode": 2 * n + wire,
                                     "decode": wire + 2 * n, "hop": 2 * wire + 2 * n}[r["program"]]
        assert r["seconds"] > 0 and r["n"] == n
        assert r["gbps"] == pytest.approx(r["fewest_bytes"] / r["seconds"] / 1e9)
        assert r["copy_gbps"] == pytest.approx(max(plain["gbps"], plain32["gbps"]))
        assert r["of_copy"] == pytest.approx(r["gbps"] / r["copy_gbps"])
        assert r["to_add"] == pytest.approx(r["seconds"] / add["seconds"])
    qdq = {r["format"]: r for r in result["quantizer"]}
    assert list(qdq) == [str(eq.Format.parse(f)) for f in QDQ_FORMATS]
    assert qdq["int8"]["to_int8"] == 1.0 and all(r["ratio"] > 0 for r in qdq.values())
    gen = _docs_gen("bench")
    site = gen.codec_table(result) + gen.bench_table(result)
    assert all(f"`{f}`" in site for f in qdq) and "vs int8" in site and "of copy" in site
    assert "vs a + b" in site



@pytest.mark.slow
def test_bench_times_the_mosaic_codec_where_asked(monkeypatch):
    """On a TPU `bench` times the Mosaic codec's kernels beside the XLA path; here, asked for
    them, it runs them in interpret mode (a test of the wiring, not a timing, so on 128 rows
    of values rather than a MiB's 4096: interpret mode's time grows with them): same fewest
    bytes, rows labelled "pallas"; an unknown path is refused in one line."""
    from equarx_ref.runs import bench

    monkeypatch.setattr(bench, "_values", lambda mib: 128 * 128)
    rows = bench.codec_throughput(1, formats=("int8",), repeats=1, paths=("xla", "pallas"))
    by = {(r["path"], r["program"]): r for r in rows if r["program"] not in ("x + 1", "a + b")}
    assert sorted(by) == sorted((p, g) for p in ("xla", "pallas") for g in bench.PROGRAMS)
    for g in bench.PROGRAMS:
        assert by["pallas", g]["fewest_bytes"] == by["xla", g]["fewest_bytes"]
        assert by["pallas", g]["seconds"] > 0
    with pytest.raises(ValueError, match=r"unknown codec paths \['mosaic'\]"):
        bench.codec_throughput(1, formats=("int8",), paths=("mosaic",))
    from equarx_ref.runs import tpu_bytes  # refused before anything compiles: no libtpu needed

    for measure in (tpu_bytes.codec_bytes, tpu_bytes.all_reduce_bytes):
        with pytest.raises(ValueError, match=r"unknown codec paths \['mosaic'\]"):
            measure("v5e:2x4", mib=1 / 4, paths=("mosaic",))
        with pytest.raises(ValueError, match=r"unknown codec paths \['gpu'\]"):
            measure("v5e:2x4", mib=1 / 4, paths=("gpu",))


@pytest.mark.slow
def test_bench_times_the_gpu_codec_where_asked():
    """On a GPU `bench` times the GPU codec's kernels beside the XLA path; asked for them
    here, it interprets them (wiring, not a timing): rows labelled "gpu" with the XLA path's
    fewest bytes, for the 8-bit and 4-bit formats only (int6 has none)."""
    from equarx_ref.runs import bench

    rows = bench.codec_throughput(1, formats=("int4", "int6"), repeats=1, paths=("xla", "gpu"))
    by = {(r["path"], r["program"], r["format"]): r for r in rows
          if r["program"] not in ("x + 1", "a + b")}
    assert {k for k in by if k[0] == "gpu"} == {("gpu", g, "int4") for g in bench.PROGRAMS}
    for g in bench.PROGRAMS:
        assert by["gpu", g, "int4"]["fewest_bytes"] == by["xla", g, "int4"]["fewest_bytes"]

def test_draw_schedule():
    ax = draw_schedule(eq.ring_schedule(4))
    labels = [t.get_text() for t in ax.texts]
    assert "c3 → 1" in labels  # step 0: device 0 sends chunk 3 to device 1
    assert sum("all-gather" in s for s in labels) == 4
    ax = draw_schedule(eq.bidir_ring_schedule(3))
    assert "c2 → 1\nc4 → 2" in [t.get_text() for t in ax.texts]  # two directions at once


_NO_METADATA = """
import sys
from importlib import metadata

def missing(name):
    raise metadata.PackageNotFoundError(name)

metadata.version = missing
from equarx_ref import cli
sys.exit(cli.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_cli_runs_from_a_source_tree_without_package_metadata():
    """From a checkout on PYTHONPATH (nothing installed) the CLI must run: the version comes
    from pyproject.toml, and no command needs the installed metadata."""
    import subprocess
    import sys
    import tomllib
    from pathlib import Path

    root = Path(cli.__file__).resolve().parents[2]
    want = tomllib.loads((root / "pyproject.toml").read_text())["project"]["version"]
    env = {"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "cpu"}
    run = [sys.executable, "-c", _NO_METADATA]
    got = subprocess.run([*run, "--version"], capture_output=True, text=True, env=env)
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == f"equarx-ref {want} (source tree)"
    got = subprocess.run([*run, "demo", "--help"], capture_output=True, text=True, env=env)
    assert got.returncode == 0 and "--size" in got.stdout, got.stderr


def test_version_prefers_the_installed_metadata(monkeypatch):
    monkeypatch.setattr(cli.metadata, "version", lambda name: "9.9.9")
    assert cli.version() == "9.9.9"

    def missing(name):
        raise cli.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(cli.metadata, "version", missing)
    assert cli.version().endswith("(source tree)")


@pytest.mark.slow
def test_cli_check_is_bitwise_the_spec(capsys, tmp_path):
    """`equarx-ref check` on this machine's default device: every format and data class, and
    the all_reduce cases, bitwise the spec; one table, one verdict, status 0."""
    out = tmp_path / "check.json"
    assert cli.main(["check", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    from equarx_ref.kernels import tiles
    from equarx_ref.kernels.gpu import FORMATS as GPU_FORMATS
    from equarx_ref.runs.check import CHECK_FORMATS

    mosaic = sum(tiles.supports(eq.Format.parse(name)) for name in CHECK_FORMATS)
    gpu = sum(name in GPU_FORMATS for name in CHECK_FORMATS)
    assert mosaic >= 7 and gpu >= 7, (mosaic, gpu)  # the 8-bit and 4-bit formats at least
    assert f"bitwise equal to the spec on {_chip()}: {len(CHECK_FORMATS)} formats, 12 data " \
        f"classes; the Mosaic codec's kernels {mosaic} formats, the GPU codec's {gpu}; " \
        "all_reduce 5 cases" in text, text
    result = json.loads(out.read_text())
    assert result["equal"] is True
    for name in ("mxfp8", "mxfp4"):
        assert result["gpu_kernels"][name] == dict.fromkeys(result["formats"][name])
    assert result["all_reduce"]["ring int8 p=8 (mosaic)"] is None


@pytest.mark.slow
def test_cli_check_shows_the_first_differing_block(capsys, monkeypatch):
    """One bit flipped in the codec's bytes: status 1, and the block that differs is shown with
    its values, the expected and the received bytes. The bit flips in every format alike, so
    int8 alone is checked (`--formats int8`); test_cli_check_is_bitwise_the_spec runs the
    whole check."""
    from equarx_ref.runs import check
    from equarx_ref.wire import to_bytes

    def flipped(q):
        buf = to_bytes(q)
        return buf.at[..., 3].set(buf[..., 3] ^ 1)  # one bit of block 0's payload

    monkeypatch.setattr(check, "to_bytes", flipped)
    monkeypatch.setattr(check, "_codec", functools.cache(check._codec.__wrapped__))
    assert cli.main(["check", "--formats", "int8"]) == 1
    text = capsys.readouterr().out
    assert f"NOT bitwise equal to the spec on {_chip()}" in text, text
    assert "first difference: int8, gaussian, by to_bytes(quantize(x))" in text, text
    lines = {line.split(":")[0].strip(): line for line in text.splitlines()}
    assert lines["block"].endswith(" 0")
    expected = json.loads(lines["expected"].split(":", 1)[1])
    got = json.loads(lines["got"].split(":", 1)[1])
    xor = [e ^ g for e, g in zip(expected, got, strict=True)]
    assert xor == [0, 0, 0, 1] + [0] * (len(got) - 4), xor
    assert "values" in lines


@pytest.mark.slow
def test_cli_check_covers_the_mosaic_codec(capsys, monkeypatch):
    """The Mosaic codec's kernels are checked too: with one bit of the encode kernel's output
    flipped, or the decode kernel's values negated, the check (of int8: `--formats int8`)
    fails and names the kernel."""
    from equarx_ref.kernels import codec, tiles
    from equarx_ref.wire import Message

    def flipped(fmt, x_ref, p_ref, s_ref):  # one bit of the payload's first byte row
        m = tiles.encode(x_ref[...], fmt)
        p_ref[...], s_ref[...] = m.payload.at[0].set(m.payload[0] ^ 1), m.scales

    monkeypatch.setattr(codec, "_encode_body", flipped)
    assert cli.main(["check", "--formats", "int8"]) == 1
    text = capsys.readouterr().out
    assert "first difference: kernels int8, gaussian, by kernels.codec.encode" in text, text
    assert any(ln.split()[:5] == ["kernels", "int8", "0", "of", "12"] for ln in text.splitlines())
    monkeypatch.undo()

    def negated(fmt, dtype, p_ref, s_ref, o_ref):  # -0.0 for +0.0 too: bits, not ==
        o_ref[...] = -tiles.decode(Message(p_ref[...], s_ref[...]), fmt, dtype)

    monkeypatch.setattr(codec, "_decode_body", negated)
    assert cli.main(["check", "--formats", "int8"]) == 1
    text = capsys.readouterr().out
    assert "first difference: kernels int8, " in text and "by kernels.codec.decode" in text, text


@pytest.mark.slow
def test_cli_check_covers_the_gpu_codec(capsys, monkeypatch):
    """The GPU codec's kernels are checked too (interpreted here, native on a GPU): with one
    bit of the encode kernel's payload flipped, the check (of int8: `--formats int8`) fails
    and names the kernel."""
    from equarx_ref.kernels import gpu

    real = gpu._encode_tile

    def flipped(x, fmt):
        payload, bits = real(x, fmt)
        return payload ^ 1, bits

    monkeypatch.setattr(gpu, "_encode_tile", flipped)
    assert cli.main(["check", "--formats", "int8"]) == 1
    text = capsys.readouterr().out
    assert "first difference: gpu kernels int8, gaussian, by kernels.gpu.encode" in text, text


@pytest.mark.slow
def test_cli_check_covers_stochastic_rounding(capsys, monkeypatch):
    """The stochastic-rounding path is checked too: with the f32-scale decision broken (every
    value rounded down), the check fails and names that path. `rounding._at_least` decides
    for f32 scales only: of the check formats only int8/f32 can fail by it, and it alone is
    checked (`--formats int8/f32`)."""
    from equarx_ref.runs import check

    rounding_module = sys.modules["equarx_ref.rounding"]
    monkeypatch.setattr(rounding_module, "_at_least", lambda r, m, S: jnp.zeros(r.shape, bool))
    monkeypatch.setattr(check, "_codec", functools.cache(check._codec.__wrapped__))
    assert cli.main(["check", "--formats", "int8/f32"]) == 1
    text = capsys.readouterr().out
    assert "first difference: int8/f32, gaussian, by to_bytes(quantize(x, key=jax.random.key(0)))" \
        in text, text
