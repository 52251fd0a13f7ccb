"""How the command line ends, for every command: one line and a status, never a traceback.

0 done; 1 a failed write (checked writable before the work, and the write itself checked: a
full disk, a figure that could not be saved); 2 a bad argument; 130 Ctrl-C; 141 (or 0) when the
reader of the output goes away. And `equarx-ref --help` imports no heavy module."""

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import cli_error
from equarx_ref import cli
from equarx_ref.cli import options

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV = {**os.environ, "PYTHONPATH": ROOT}


def _cli(*argv, **kw):
    return subprocess.Popen([sys.executable, "-m", "equarx_ref.cli", *argv], cwd=ROOT, env=ENV,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def _one_line(err: str) -> str:
    """The one error line (a refused option's usage may follow it: `cli_error`)."""
    return cli_error(err)


def test_help_imports_no_heavy_module():
    code = ("import sys\nfrom equarx_ref import cli\ntry:\n    cli.main(['--help'])\n"
            "except SystemExit:\n    pass\nprint(' '.join(sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, check=True,
                            capture_output=True, text=True).stdout.split("\n")[-2].split()
    heavy = [m for m in loaded if m.split(".")[0] in ("matplotlib", "tqdm", "gguf", "tokenizers")
             or m.startswith(("equarx_ref.gemma", "equarx_ref.kernels", "equarx_ref.viz",
                              "equarx_ref.runs", "equarx_ref.multihost", "equarx_ref.outliers",
                              "jax.experimental.pallas"))]
    assert not heavy, heavy


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_ctrl_c_is_status_130_and_one_line(command, monkeypatch, capsys):
    def interrupted(_args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli.command_module(command), f"cmd_{command}", interrupted)
    assert cli.main([command]) == 130
    assert _one_line(capsys.readouterr().err) == f"equarx-ref {command}: interrupted"


@pytest.mark.parametrize("command", list(cli.COMMANDS))
def test_output_paths_are_checked_before_the_work(command, monkeypatch, capsys):
    """Every output option of every command refuses a path it cannot write, at parse time."""
    monkeypatch.setattr(cli.command_module(command), f"cmd_{command}",
                        lambda _args: pytest.fail("the work started"))
    parser = cli._parser([command])
    sub = next(a for a in parser._actions if a.dest == "command").choices[command]
    outputs = [a for a in sub._actions if a.type in (options.writable, options.figure_path)]
    assert outputs, command
    for action in outputs:
        flag = action.option_strings[0]
        # a missing directory; a directory; a directory named as one, existing or not
        for path in ("/no/such/dir/out.json", ROOT, os.path.join(ROOT, "no_such_dir") + "/",
                     os.path.join(ROOT, "no_such_dir", "."), "./"):
            with pytest.raises(SystemExit) as e:
                cli.main([command, flag, path])
            assert e.value.code == 2
            assert "cannot write" in _one_line(capsys.readouterr().err)


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_a_failed_write_is_one_line_and_status_1(flag):
    proc = _cli("model", flag, "/dev/full")  # a full disk: the write fails after the work
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 1, (out, err)
    assert _one_line(err) == ("equarx-ref model: error: cannot write '/dev/full': No space "
                              "left on device")


def test_figure_types_are_checked_before_the_work(capsys):
    with pytest.raises(SystemExit):
        cli.main(["model", "--plot", "/tmp/speedup.txt"])
    assert "cannot write a figure as .txt" in _one_line(capsys.readouterr().err)


def test_a_figure_and_json_are_written(tmp_path, capsys):
    assert cli.main(["model", "--plot", str(tmp_path / "s.svg"), "--json",
                     str(tmp_path / "m.json")]) == 0
    assert (tmp_path / "s.svg").read_text().lstrip().startswith("<?xml")
    assert json.loads((tmp_path / "m.json").read_text())["modelled"] is True


@pytest.mark.parametrize("shell", ["equarx-ref model | true",
                                   "{ echo x; equarx-ref model; } | head -n 1",
                                   "equarx-ref model --json - | head -c 10"])
def test_a_closed_pipe_exits_quietly(shell, tmp_path):
    run = f"{sys.executable} -m equarx_ref.cli"
    script = f"set -o pipefail; {shell.replace('equarx-ref', run)}; echo status=$? >&2"
    done = subprocess.run(["bash", "-c", script], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=120)
    status = int(done.stderr.strip().splitlines()[-1].removeprefix("status="))
    assert status in (0, 141), done.stderr
    assert "Traceback" not in done.stderr and "Error" not in done.stderr, done.stderr


def test_ctrl_c_during_a_real_demo():
    proc = _cli("demo", "--devices", "2", "--size", "4096", "--repeats", "100000")
    try:
        first = proc.stderr.readline()  # "  compiling ...": the work has started
        assert "compiling" in first, first
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()  # a demo that ignored the interrupt would run on for minutes
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "equarx-ref demo: interrupted"  # after progress


def test_ctrl_c_ends_the_run_when_a_library_drops_the_interrupt():
    """A KeyboardInterrupt swallowed inside the command (as one raised in a callback run from
    C++ can be) still ends the run: `INTERRUPT_GRACE_S` after Ctrl-C, status 130, one line."""
    code = textwrap.dedent("""
        import os, signal, sys, time
        from equarx_ref import cli
        cli.INTERRUPT_GRACE_S = 0.5

        def swallowing(args):
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(100):
                try:
                    time.sleep(0.1)
                except KeyboardInterrupt:
                    pass  # dropped, as inside a library
            return 0

        args = cli._parse(["model"])  # the parser's command, its work replaced
        args.func = swallowing
        cli._parse = lambda argv: args
        sys.exit(cli.main(["model"]))
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 130 and done.stderr.strip() == "equarx-ref model: interrupted", \
        done.stderr


NOTHING_TO_RUN = {  # options a parser takes one by one, together not something the run can do
    "train --steps 1000000000": "steps must be at most 104850",
    "train --json no_such_dir/": "names a directory",
    "sweep --p 2 --algorithms one_shot --remedies sr": "nothing to run",
    "sweep --algorithms ring --formats mxfp8 --remedies adaptive": "nothing to run",
    "sweep --algorithms bidir_ring one_shot --remedies rotate adaptive": "nothing to run",
    "gemma --algorithms psum --formats int8 int4": "nothing to run",
    "kernels --compile v5e:2x4 --only none": "nothing to run",
    "train --hops --variants 'int4 ring'": "--hops tabulates the f32 run",
    "train --hops --seeds 2": "--hops tabulates the f32 run",
    "sweep --p 2 300 --remedies adaptive": "at most 256 devices",
    "sweep --p 2 --formats int4 int4/b24 --remedies none rotate": "power of two",
}


@pytest.mark.parametrize("argv", list(NOTHING_TO_RUN))
def test_what_the_run_cannot_honour_is_refused_before_the_work(argv, monkeypatch, capsys):
    """#wrong, the command line: a run that cannot fit in memory, an output path naming a
    directory, an option mix that leaves nothing to run: one line and status 2, before any
    device is set up (they ended in a traceback, or after the work, or with status 1)."""
    from equarx_ref import devices

    monkeypatch.setattr(devices, "setup_devices", lambda *_: pytest.fail("the work started"))
    try:
        status = cli.main(shlex.split(argv))
    except SystemExit as e:
        status = e.code
    assert status == 2
    assert NOTHING_TO_RUN[argv] in _one_line(capsys.readouterr().err)


def test_json_is_strict_and_a_table_may_be_empty(capsys):
    """#wrong, outputs: NaN and infinities are JSON null (RFC 8259 has no NaN: `--seeds 1`
    wrote its missing standard errors as NaN); a table of no rows is its headers."""
    options.write_json("-", {"se": float("nan"), "v": [1.5, float("inf")], "n": None})
    assert json.loads(capsys.readouterr().out, parse_constant=pytest.fail) == {
        "se": None, "v": [1.5, None], "n": None}
    assert options.table(["a", "bb"], []).splitlines() == ["a  bb", "-  --"]


@pytest.mark.parametrize("error", [MemoryError(), RuntimeError(
    "RESOURCE_EXHAUSTED: Out of memory allocating 1024000000000 bytes.")])
def test_out_of_memory_is_one_line_and_status_1(error, monkeypatch, capsys):
    """A run too large for this machine (a size no parser can know too large) ends in one
    line, status 1, not the 23-line traceback of XLA's failed allocation."""
    def too_big(_args):
        raise error
    monkeypatch.setattr(cli.command_module("demo"), "cmd_demo", too_big)
    assert cli.main(["demo"]) == 1
    assert _one_line(capsys.readouterr().err).startswith("equarx-ref demo: error: out of memory")
    monkeypatch.setattr(cli.command_module("demo"), "cmd_demo",
                        lambda _args: 1 / 0)  # any other failure is a bug: its traceback
    with pytest.raises(ZeroDivisionError):
        cli.main(["demo"])


def test_gemma_precision_choices_are_the_models():
    """--precision offers exactly the names the model takes (gemma.model.PRECISIONS), not a copy."""
    from equarx_ref.gemma.model import PRECISIONS

    parser = cli._parser(["gemma"])
    sub = next(a for a in parser._actions if a.dest == "command").choices["gemma"]
    (action,) = [a for a in sub._actions if "--precision" in a.option_strings]
    assert tuple(action.choices) == tuple(PRECISIONS) and action.default in PRECISIONS
