"""The network of a multi-host run: link rates, one namespace per host, and the guardian.

As root, with a rate (`link="1gbit"`), each host gets a network namespace of its own with one
veth link into a bridge, and `tc tbf` caps what it sends at that rate: hosts on a switch. gloo
binds to the address the host name resolves to, so each namespace's `/etc/netns/NAME/hosts`
maps the name to that host's own address (`ip netns exec` mounts it over `/etc/hosts`). Only
these namespaces and loopback are used; the root namespace gets no address in their subnet.

Cleaning up. Every resource a run may create is named before anything is made (`names`), so
it can always be removed (`teardown`, safe to repeat). The launcher removes them after success,
failure, Ctrl-C or SIGTERM; after a `kill -9` of the launcher the guardian does: a small process
in a session of its own, told every resource before it is made, that tears them all down when
the launcher's pipe closes (the kernel closes it when the launcher dies) or when the run's
deadline passes. The guardian runs this file alone (`GUARDIAN`: no package, no JAX import), so
it starts in a fraction of a second; hence this module imports only the standard library.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

__all__ = ["GUARDIAN", "SUBNET", "guard", "leftovers", "make_network", "names", "parse_rate",
           "teardown"]

SUBNET = "10.213.0"  # private, and private to each run: only its namespaces hold it
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)bit$")

#: `python -c GUARDIAN <this file>`: the guardian, this file run alone (module essay).
GUARDIAN = "import runpy, sys; runpy.run_path(sys.argv[1], run_name='guardian')['guard']()"


def parse_rate(text: str) -> float:
    """A tc rate such as "100mbit", "1gbit", "2.5gbit" -> bits per second."""
    if not isinstance(text, str):
        raise TypeError(f"link rate must be a string such as '1gbit', got {text!r}")
    m = _RATE.match(text.strip().lower())
    if not m or float(m[1]) <= 0:
        raise ValueError(f"link rate must look like 100mbit or 1gbit (tc syntax), got {text!r}")
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]


def names(tag: str, hosts: int) -> dict:
    """Everything a run may create, named before anything is made (so it can be removed)."""
    return {"netns": [f"eqx{tag}h{i}" for i in range(hosts)],
            "veths": [f"eqx{tag}v{i}" for i in range(hosts)],
            "bridge": f"eqx{tag}br", "etc": [f"/etc/netns/eqx{tag}h{i}" for i in range(hosts)]}


def ip(*args: str, check: bool = True) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def make_network(net: dict, rate: str, deadline: float | None = None) -> None:
    """Make `net` (see `names`), each host's link capped at `rate`; TimeoutError past
    `deadline` (time.monotonic) between hosts."""
    ip("link", "add", net["bridge"], "type", "bridge")
    ip("link", "set", net["bridge"], "up")
    for i, (ns, veth, etc) in enumerate(zip(net["netns"], net["veths"], net["etc"], strict=True)):
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError("the multi-host run passed its time limit (--timeout) while "
                               f"making the network ({i} of {len(net['netns'])} hosts made)")
        ip("netns", "add", ns)
        peer = veth + "p"
        ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        ip("link", "set", peer, "netns", ns)
        ip("-n", ns, "link", "set", peer, "name", "eth0")
        ip("-n", ns, "addr", "add", f"{SUBNET}.{i + 1}/24", "dev", "eth0")
        for dev in ("lo", "eth0"):
            ip("-n", ns, "link", "set", dev, "up")
        ip("link", "set", veth, "master", net["bridge"])
        ip("link", "set", veth, "up")
        ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
           rate, "burst", "128kb", "latency", "50ms")
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "hosts"), "w", encoding="utf-8") as f:
            f.write(f"127.0.0.1 localhost\n{SUBNET}.{i + 1} {socket.gethostname()}\n")


def teardown(net: dict | None, pgids, tmp: str | None) -> None:
    """Kill the workers, remove every resource of `net`; safe to repeat, never raises."""
    for g in pgids:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)
    if net:
        for ns in net["netns"]:
            for pid in ip("netns", "pids", ns, check=False).split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for veth in net["veths"]:
            ip("link", "del", veth, check=False)
        ip("link", "del", net["bridge"], check=False)
        for ns in net["netns"]:
            ip("netns", "del", ns, check=False)
        for etc in net["etc"]:
            shutil.rmtree(etc, ignore_errors=True)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def leftovers(net: dict) -> list[str]:
    """Resources of `net` that still exist (empty after every run)."""
    links = ip("-o", "link", "show", check=False)
    return ([ns for ns in net["netns"] if ns in ip("netns", "list", check=False).split()]
            + [d for d in (*net["veths"], net["bridge"]) if f" {d}:" in links or f" {d}@" in links]
            + [e for e in net["etc"] if os.path.exists(e)])


def guard() -> None:
    """The guardian (`GUARDIAN`): reads the resources (JSON lines) from stdin; at EOF (the
    launcher finished or died) or at the deadline, removes them all."""
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    state = {"net": None, "pgids": [], "tmp": None, "deadline": time.time() + 3600}
    lines: queue.Queue = queue.Queue()

    def read():
        for line in sys.stdin:
            lines.put(json.loads(line))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    print("ready", flush=True)
    while True:
        try:
            msg = lines.get(timeout=max(0.0, state["deadline"] - time.time()))
        except queue.Empty:
            break  # past the deadline
        if msg is None:
            break
        for key, value in msg.items():
            state[key] = state[key] + value if key == "pgids" else value
    teardown(state["net"], state["pgids"], state["tmp"])
