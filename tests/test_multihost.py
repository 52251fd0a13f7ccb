"""Multi-host runs: N processes of one JAX job, bitwise the single-process result, and nothing
left behind (namespaces, links, hosts files, processes) however the launcher ends."""

import os
import signal
import subprocess
import sys
import time

import pytest

from equarx_ref import cli, multihost

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")


def test_two_hosts_on_loopback_are_bitwise_one_process():
    n = 3001  # odd: padding to whole blocks and chunks
    result = multihost.run(2, sizes=[2 * n], algorithms=["ring", "bidir_ring", "two_shot",
                                                         "one_shot"],
                           formats=["int8", "int4"], repeats=1, progress=False, timeout=300)
    rows = {(r["algorithm"], r["format"]): r for r in result["results"]}
    assert len(rows) == 1 + 4 * 2 and result["checked_against_one_process"]
    assert result["network"] == "2 processes on loopback, uncapped" and result["link"] is None
    bad = [k for k, r in rows.items() if not r["bitwise_equal"]]
    assert not bad, f"hosts or the single-process run disagree: {bad}"
    assert len({r["digest"] for r in rows.values()}) == len(rows)  # the check can tell apart
    for key, r in rows.items():
        assert r["wire_bytes_per_device"] == r["model_bytes_per_device"] \
            == r["link_bytes_per_device"], key
        assert r["seconds"] > 0 and r["predicted_seconds"] > 0 and r["link_seconds"] > 0, key
    assert rows["ring", "bf16"]["speedup_vs_bf16"] == 1.0


def test_every_run_is_bounded_in_time():
    with pytest.raises(TimeoutError, match="time limit"):
        multihost.run(2, sizes=[1 << 20], repeats=50, progress=False, check=False, timeout=2)


def _exit_code(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse refuses a flag
        return e.code


@pytest.mark.parametrize("argv, message", [
    ("--hosts 1", "expected an integer >= 2"),
    ("--hosts 2 --link fast", "link rate must look like"),
    ("--link 1gbit", "--link and --plot go with --hosts"),
    ("--hosts 2 --formats int16", "int16"),
    ("--hosts 2 --timeout 5", "expected an integer >= 10"),
])
def test_bad_flags(argv, message, capsys):
    assert _exit_code(["bench", *argv.split()]) == 2
    assert message in capsys.readouterr().err


@as_root
def test_a_run_that_cannot_finish_in_time_is_refused_before_it_starts(capsys):
    assert cli.main(["bench", "--hosts", "4", "--link", "100mbit", "--mib", "64",
                     "--timeout", "60"]) == 2
    assert "over the 60 s limit" in capsys.readouterr().err


def _launch(*extra):
    return subprocess.Popen(
        [sys.executable, "-m", "equarx_ref.cli", "bench", "--hosts", "2", "--link", "1gbit",
         "--mib", "2", "--algorithms", "ring", "--formats", "bf16", "--repeats", "200",
         "--timeout", "120", "--no-progress", *extra],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _running(net) -> bool:
    """Every host's namespace exists and holds its worker."""
    return all(multihost._ip("netns", "pids", ns, check=False).split() for ns in net["netns"])


@as_root
@pytest.mark.parametrize("how", ["kill -9", "Ctrl-C", "SIGTERM", "a worker dies"])
def test_nothing_is_left_behind(how):
    proc = _launch()
    net = multihost._names(str(proc.pid), 2)
    deadline = time.monotonic() + 90
    while not _running(net):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(2)  # the job is up: hosts joined, collectives running
    if how == "a worker dies":
        os.kill(int(multihost._ip("netns", "pids", net["netns"][1]).split()[0]), signal.SIGKILL)
    else:
        proc.send_signal({"kill -9": signal.SIGKILL, "Ctrl-C": signal.SIGINT,
                          "SIGTERM": signal.SIGTERM}[how])
    _, err = proc.communicate(timeout=60)
    deadline = time.monotonic() + 20  # after kill -9 the guardian needs a moment
    while multihost.leftovers(net) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert multihost.leftovers(net) == []
    assert not os.path.exists("/etc/netns") or not [
        e for e in os.listdir("/etc/netns") if e.startswith(f"eqx{proc.pid}")]
    assert proc.returncode == {"kill -9": -9, "Ctrl-C": 130, "SIGTERM": 143,
                               "a worker dies": 1}[how], err
    if how == "a worker dies":
        assert "worker 1 failed" in err
