"""The command line as a newcomer meets it: what `demo` and `check` print agrees with itself.

- `demo` at a size where `all_reduce`'s default size gate sends some rows unquantized: such a
  row says so wherever it would otherwise claim a format (format, bits/el, theory, note), and
  its bytes and error are the bf16 row's (they were labelled int8 with 8.5 bits and a theory).
- Simulated devices are bounded (`MAX_SIMULATED_DEVICES`): `demo --devices 9999` and
  `sweep --p 1000000000` end at once in one line naming the bound (they hung, or ended in a
  bad_alloc traceback).
- `demo` takes `--formats` and `--algorithms` as `sweep`, `bench` and `gemma` do, and a refused
  option is worded by the command it was given to, "equarx-ref demo: error: ...", followed by
  that command's usage.
- `check` says what it is doing while it compiles (it ran a silent minute), and takes
  `--formats` to check only some formats (and the all_reduce cases in them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

import equarx_ref as eq
from conftest import cli_error
from equarx_ref import cli
from equarx_ref.models.predict import quantizing_saves_bytes
from equarx_ref.runs import check as check_run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
def test_demo_rows_the_size_gate_sent_unquantized_say_so(tmp_path, capsys):
    """p = 3, 100 values (the issue's `demo --devices 3 --size 100`): a quantized message is
    whole rows of `Format.row` values, so the ring's 3 chunks of 34 values each pad to a row;
    where that sends no fewer bytes than bf16, all_reduce sends bf16 (the size gate). The
    one-shot sends one message of 100 values, padded once. Which rows are gated is computed
    from `wire_bytes` quantized (min_bytes=0) and unquantized, and both kinds must occur."""
    out = tmp_path / "demo.json"
    formats = ("bf16", "int8", "fp8_e4m3", "int4")
    assert cli.main(["demo", "--devices", "3", "--size", "100", "--repeats", "1",
                     "--algorithms", "ring", "one_shot", "--formats", *formats,
                     "--no-progress", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    rows = json.loads(out.read_text())["rows"]
    assert [(r["algorithm"], r["format"]) for r in rows] == [
        (a, f) for a in ("ring", "one_shot") for f in formats]
    by = {(r["algorithm"], r["format"]): r for r in rows}
    table = {tuple(line.split()[:2]): line for line in printed.splitlines()
             if line.split()[:1] in (["ring"], ["one_shot"])}
    for r in rows:
        if r["format"] == "bf16":
            continue
        fmt = eq.Format.parse(r["format"])
        expect = not quantizing_saves_bytes(100, 3, fmt=fmt, algorithm=r["algorithm"],
                                            dtype="bfloat16")
        assert r["gated"] == expect, r
        line = table[r["algorithm"], r["format"]]
        cells = line.split()
        if r["gated"]:
            plain = by[r["algorithm"], "bf16"]
            assert r["bytes_sent"] == plain["bytes_sent"] and r["rel_error"] == \
                plain["rel_error"], (r, plain)  # it did send bf16
            assert r["bits_per_element"] == 16 and r["predicted_error"] == 0.0
            assert cells[1:4] == [r["format"], "(as", "bf16)"] and cells[4] == "16", line
            assert cells[8] == "-" and line.rstrip().endswith("sent bf16: size gate"), line
        else:
            assert r["bits_per_element"] == fmt.bits_per_element and r["note"] == ""
            assert cells[1] == r["format"] and cells[2] == f"{fmt.bits_per_element:g}"
            assert cells[6] == f"{r['predicted_error']:.2e}", line
    def sent(a, f):
        fmt = None if f == "bf16" else eq.Format.parse(f)
        return eq.wire_bytes(100, 3, fmt=fmt, algorithm=a, dtype="bfloat16", min_bytes=0)

    wasteful = {(a, f) for a, f in by if f != "bf16" and sent(a, f) >= sent(a, "bf16")}
    gated = {k for k, r in by.items() if r["gated"]}
    assert gated == wasteful, (gated, wasteful)
    assert gated and len(gated) < len(rows) - 2, "the demo shows gated and quantized rows both"
    assert "size gate (min_bytes=None) sent these rows unquantized" in printed


@pytest.mark.slow
def test_simulated_devices_are_bounded_and_refused_at_once():
    with pytest.raises(ValueError, match=r"at most MAX_SIMULATED_DEVICES = 256 simulated CPU "
                                         r"devices, got 9999"):
        eq.setup_devices(9999)
    for argv in (["demo", "--devices", "9999", "--size", "10"],
                 ["sweep", "--p", "1000000000", "--remedies", "none"]):
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "equarx_ref", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": ROOT})
        assert proc.returncode == 2, proc.stderr[-2000:]
        line = cli_error(proc.stderr)
        assert line.startswith(f"equarx-ref {argv[0]}: error: ") and \
            "MAX_SIMULATED_DEVICES = 256" in line, line
        assert time.perf_counter() - t0 < 60, "the bound is checked before any work"


def test_demo_takes_formats_and_algorithms(monkeypatch, capsys):
    from equarx_ref.runs import demo

    asked = {}

    def fake(devices, size, **kw):
        asked.update(kw)
        return {"devices": "none", "size": size, "rows": []}
    monkeypatch.setattr(demo, "demo", fake)
    assert cli.main(["demo", "--formats", "int9", "int4/b16", "bf16", "--algorithms",
                     "two_shot", "psum", "--no-progress"]) == 0
    assert asked["formats"] == ["int9", "int4/b16", "bf16"] and \
        asked["algorithms"] == ["two_shot", "psum"] and asked["progress"] is None
    fmts, pairs = demo.demo_configurations(["int9"], ["two_shot"])
    assert list(fmts) == ["bf16", "int9"]
    assert pairs == [("ring", "bf16"), ("two_shot", "int9")]  # the baseline of every ratio
    assert demo.demo_configurations(None, None)[1][:2] == [("psum", "bf16"), ("ring", "bf16")]


@pytest.mark.parametrize("argv, words", [
    (["demo", "--format", "int99"], "equarx-ref demo: error: argument --formats: "),
    (["demo", "--bogus"], "equarx-ref demo: error: unrecognized arguments: --bogus"),
    (["demo", "--algorithms", "tree"], "equarx-ref demo: error: argument --algorithms: "),
    (["check", "--formats", "int8", "int99"], "equarx-ref check: error: argument --formats: "
     "format 'int99'"),
    (["check", "--formats", "bf16"], "equarx-ref check: error: argument --formats: "),
    (["nosuch"], "equarx-ref: error: argument command: invalid choice: 'nosuch'"),
])
def test_a_refused_option_names_its_command_and_shows_its_usage(argv, words, monkeypatch,
                                                                 capsys):
    from equarx_ref import devices

    monkeypatch.setattr(devices, "setup_devices", lambda *_: pytest.fail("the work started"))
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and cli_error(err).startswith(words), err
    command = " ".join(["equarx-ref", *argv[:1]]) if argv[0] != "nosuch" else "equarx-ref"
    assert err.splitlines()[1].startswith(f"usage: {command} "), err


def test_nothing_to_run_is_refused_before_the_work(monkeypatch, capsys):
    from equarx_ref import devices

    monkeypatch.setattr(devices, "setup_devices", lambda *_: pytest.fail("the work started"))
    assert cli.main(["demo", "--algorithms", "psum", "--formats", "int8"]) == 2
    assert "nothing to run: psum sends bf16 only" in cli_error(capsys.readouterr().err)


def _options(command: str) -> set[str]:
    parser = cli._parser([command])
    return {o for a in parser.commands[command]._actions for o in a.option_strings}


def test_sibling_commands_take_the_same_options():
    """The commands that run collectives choose them alike; the ones that take more than a
    moment can be quiet alike."""
    for command in ("demo", "bench", "gemma", "sweep"):
        assert {"--formats", "--algorithms", "--json"} <= _options(command), command
    for command in ("demo", "bench", "gemma", "kernels", "outliers", "sweep", "train", "check"):
        assert "--no-progress" in _options(command), command


@pytest.mark.slow
def test_check_says_what_it_is_doing(monkeypatch, capsys):
    """`check --formats int8` (the whole check is test_cli's), with two all_reduce cases of
    which one is int8's: a line per part of int8 on stderr as it starts, and only those parts
    run; none with --no-progress (`--formats int7/b8`: no kernels, no all_reduce case); the
    table and verdict as before."""
    monkeypatch.setattr(check_run, "REDUCE_CASES", (("ring", "int8", 1000, "xla"),
                                                    ("two_shot", "mxfp8", 999, "xla")))
    assert cli.main(["check", "--formats", "int8"]) == 0
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert lines == ["  checking int8: 12 data classes, 3 paths to the wire",
                     "  checking int8: the Mosaic codec's kernels",
                     "  checking int8: the GPU codec's kernels",
                     "  checking all_reduce ring int8 p=8"], lines
    assert "bitwise equal to the spec on CPU: 1 formats, 12 data classes; the Mosaic " \
        "codec's kernels 1 formats, the GPU codec's 1; all_reduce 1 cases" in captured.out
    assert cli.main(["check", "--formats", "int7/b8", "--no-progress"]) == 0
    captured = capsys.readouterr()
    assert captured.err == ""
    assert "bitwise equal to the spec on CPU: 1 formats, 12 data classes; the Mosaic " \
        "codec's kernels 0 formats, the GPU codec's 0; all_reduce 0 cases" in captured.out


def test_format_names_are_listed_in_counting_order():
    with pytest.raises(ValueError) as e:
        eq.Format("int13")
    listed = [n.strip(" '[]") for n in str(e.value).split("choose one of ")[1].split(",")]
    ints = [n for n in listed if n.startswith("int")]
    assert ints == [f"int{b}" for b in range(2, 13)], listed
