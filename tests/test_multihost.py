"""Multi-host runs: N processes of one JAX job, bitwise the single-process result, and nothing
left behind (namespaces, links, hosts files, processes) however the launcher ends. Failures end
the run at once, named: a host that fails, a taken port, the time limit, a machine too small."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from equarx_ref import cli, multihost
from equarx_ref.multihost import launcher, network

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root")
FLAG = "--xla_force_host_platform_device_count"


@pytest.mark.slow
def test_two_hosts_on_loopback_are_bitwise_one_process(monkeypatch):
    # the flag setup_devices' message recommends, in the launcher's environment: the workers
    # must not inherit it (each host is one device)
    monkeypatch.setenv("XLA_FLAGS", f"{FLAG}=8")
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


def test_the_workers_environment_is_built_on_purpose():
    env = launcher.worker_env({"XLA_FLAGS": f"--xla_cpu_foo=1 {FLAG}=8", "PATH": "/bin",
                               "JAX_NUM_CPU_DEVICES": "8", "JAX_PLATFORMS": "tpu"})
    assert env["XLA_FLAGS"] == "--xla_cpu_foo=1" and env["PATH"] == "/bin"
    assert "JAX_NUM_CPU_DEVICES" not in env and env["JAX_PLATFORMS"] == "cpu"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == ROOT
    assert "XLA_FLAGS" not in launcher.worker_env({"XLA_FLAGS": f"{FLAG}=4"})


def _one_host_with_the_flag(monkeypatch, host: int):
    """Host `host` starts with the device-count flag after all: it must refuse, naming it."""
    calls = []

    def env():
        calls.append(1)
        extra = {"XLA_FLAGS": f"{FLAG}=8"} if len(calls) == host + 1 else {}
        return {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, **extra}
    monkeypatch.setattr(launcher, "worker_env", env)


@pytest.mark.parametrize("host", [0, 1])
def test_a_failing_host_ends_the_run_at_once_named(monkeypatch, host):
    """At once: the failure itself is reported (RuntimeError), not the time limit's TimeoutError
    that waiting for the stalled peer would end in (no wall clock: a loaded machine is slow)."""
    _one_host_with_the_flag(monkeypatch, host)
    with pytest.raises(RuntimeError, match=f"worker {host} failed") as e:
        multihost.run(2, sizes=[1 << 12], algorithms=["ring"], formats=["int8"], repeats=1,
                      progress=False, check=False, timeout=300)
    assert not isinstance(e.value, TimeoutError)
    assert FLAG in str(e.value) and "must have one CPU device" in str(e.value)


def _taken_port(monkeypatch, times: int):
    """The first `times` coordinator ports offered are held by another socket."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = [holder.getsockname()[1]] * times
    real = launcher._free_port
    monkeypatch.setattr(launcher, "_free_port", lambda: taken.pop() if taken else real())
    return holder


@pytest.mark.slow
def test_a_taken_port_is_retried(monkeypatch):
    with _taken_port(monkeypatch, 1):
        result = multihost.run(2, sizes=[1 << 12], algorithms=["ring"], formats=["int8"],
                               repeats=1, progress=False, check=False, timeout=300)
    assert all(r["bitwise_equal"] for r in result["results"])


@pytest.mark.slow
def test_a_port_taken_every_time_is_named(monkeypatch):
    with _taken_port(monkeypatch, 3) as holder:
        port = holder.getsockname()[1]
        with pytest.raises(RuntimeError, match=f"could not bind its port .*{port}") as e:
            multihost.run(2, sizes=[1 << 12], algorithms=["ring"], formats=["int8"],
                          repeats=1, progress=False, check=False, timeout=300)
    assert not isinstance(e.value, TimeoutError)  # named, not waited out


@pytest.mark.parametrize("hosts", [2, 6])
@pytest.mark.slow
def test_the_time_limit_holds(hosts, monkeypatch):
    """50 repeats of 1 MiB take longer than 10 s: the run ends in the limit's TimeoutError
    (were the limit not enforced, it would finish and return), every worker it started
    stopped. Checked by outcome, not by a wall clock (a loaded machine is slow)."""
    started = []
    spawn = launcher._Run.spawn

    def spawned(self, *args, **kw):
        started.append(spawn(self, *args, **kw))
        return started[-1]

    monkeypatch.setattr(launcher._Run, "spawn", spawned)
    with pytest.raises(TimeoutError, match="time limit"):
        multihost.run(hosts, sizes=[1 << 20], repeats=50, progress=False, check=False,
                      timeout=10)
    assert started and all(w.poll() is not None for w in started), "a worker outlived the run"


@pytest.mark.parametrize("hosts, timeout, reason", [
    (100, 10, "GiB of memory"),    # 100 JAX processes do not fit in this machine's memory
    (12, 10, "just to start"),     # nor start in 5 s on its cores
])
def test_hosts_the_machine_cannot_serve_are_refused_up_front(hosts, timeout, reason,
                                                            monkeypatch):
    monkeypatch.setattr(launcher, "_memory_available", lambda: 24 << 30)
    monkeypatch.setattr(os, "sched_getaffinity", lambda _pid: {0, 1})
    _nothing_starts(monkeypatch)  # up front: refused before any process, not after a while
    with pytest.raises(ValueError, match=reason):
        multihost.run(hosts, sizes=[1 << 20], progress=False, timeout=timeout)


def _nothing_starts(monkeypatch):
    def refuse(*_args, **_kw):
        raise AssertionError("the run started (guardian, network or workers) before refusing")

    monkeypatch.setattr(launcher, "_Run", refuse)


def test_the_cli_refuses_them_in_one_line(capsys, monkeypatch):
    _nothing_starts(monkeypatch)
    assert cli.main(["bench", "--hosts", "100", "--timeout", "10"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "100 hosts" in err[0], err


def _exit_code(argv: list[str]) -> int:
    try:
        return cli.main(argv)
    except SystemExit as e:  # argparse refuses a flag
        return e.code


@pytest.mark.parametrize("argv, message", [
    ("--hosts 1", "expected an integer >= 2"),
    ("--hosts 2 --link fast", "link rate must look like"),
    ("--link 1gbit", "--link goes with --hosts"),
    ("--algorithms ring --formats int8", "--algorithms, --formats go with --hosts"),  # #wrong:
    ("--timeout 60", "--timeout goes with --hosts"),  # they were ignored without --hosts
    ("--hosts 2 --formats int16", "int16"),
    ("--hosts 2 --timeout 5", "expected an integer >= 10"),
])
def test_bad_flags(argv, message, capsys):
    assert _exit_code(["bench", *argv.split()]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flags, recorded", [([], None), (["--timeout", "2400"], 2400)])
def test_the_record_names_the_time_limit_it_ran_with(flags, recorded, monkeypatch, tmp_path):
    """The command a run stores is the one that reproduces it: --timeout when not the
    default, since a slow link needs it (the launcher is replaced: no hosts start)."""
    row = {"algorithm": "ring", "format": "bf16", "message_bytes": 1 << 20, "seconds": 1.0,
           "wire_bytes_per_device": 1, "predicted_seconds": 1.0, "speedup_vs_bf16": 1.0,
           "link_seconds": 1.0, "compute_seconds": 0.0, "add_seconds": 0.1,
           "bitwise_equal": True}
    got = {}

    def run(hosts, **kw):
        got.update(kw)
        return {"network": "fake", "calibration": {"memory_bytes_per_s": 1e9},
                "chip": {"link_bandwidth": 1e8, "hop_latency": 0.0, "fresh_bandwidth": 1e9},
                "results": [row]}

    monkeypatch.setattr(launcher, "run", run)
    out = tmp_path / "run.json"
    assert cli.main(["bench", "--hosts", "2", "--mib", "1", *flags, "--json", str(out)]) == 0
    command = json.loads(out.read_text())["command"].split()
    assert got["timeout"] == (recorded or cli.collectives.TIMEOUT_S)
    assert ("--timeout" in command) == bool(recorded)
    if recorded:
        assert command[command.index("--timeout") + 1] == str(recorded)


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
    return all(network.ip("netns", "pids", ns, check=False).split() for ns in net["netns"])


@as_root
@pytest.mark.parametrize("how", ["kill -9", "Ctrl-C", "SIGTERM", "a worker dies"])
@pytest.mark.slow
def test_nothing_is_left_behind(how):
    proc = _launch()
    net = network.names(str(proc.pid), 2)
    deadline = time.monotonic() + 90
    while not _running(net):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    time.sleep(2)  # the job is up: hosts joined, collectives running
    if how == "a worker dies":
        os.kill(int(network.ip("netns", "pids", net["netns"][1]).split()[0]), signal.SIGKILL)
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
