"""The launcher of a multi-host run: checks, workers, waiting, and the report with its Chip.

`run(hosts, ...)` starts `hosts` worker processes (`worker.py`) as one JAX job, over loopback or,
as root with a rate, over capped links in network namespaces (`network.py`), waits for them,
then runs the single-process reference and builds the report: per algorithm x format x message
size the slowest host's seconds (median over repeats), the bytes read from the compiled HLO,
the sends alone, and `predicted_time` with a `Chip` made of this run's own figures:

    link_bandwidth, hop_latency, hbm_bandwidth    the hosts' calibration (medians over hosts)
    fresh_bandwidth                               first touch of fresh pages: a result of
                                                  32 MiB or more (`cost.FRESH_BYTES`)
    primitive_bandwidth                           each collective primitive, timed on its own
    codec_bandwidth                               per format, the hop's dequantize-add-quantize;
                                                  for bf16 rows the unquantized hop replaces
                                                  hbm_bandwidth (its one memory pass)

Refused before anything starts, with the reason: arguments out of range, a run whose bytes
alone cannot cross the capped links in time, and host counts this machine cannot serve (each
host is a JAX process of about `HOST_MEMORY` bytes plus its messages, and takes about
`HOST_START_CPU_S` CPU seconds to start: all of them must fit in the memory available and
start within half the time limit on the cores this process may use).

Failing fast. The workers' environment is built on purpose (`worker_env`: CPU only, this
package first on the path, no flag that would split a host into several devices). The launcher
polls every worker several times a second: the first to fail ends the run at once, named, with
the last lines of its log; a coordinator port found taken is retried with another, twice, then
named. The time limit covers everything (network, start, run, reference): past it the run
stops within a poll, the hosts are killed and every resource removed.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING

from .._checks import count
from ..formats import BYTE_LADDER, UNQUANTIZED
from . import network
from .worker import DEVICE_COUNT_FLAG

if TYPE_CHECKING:  # imported where used: the launcher itself runs without jax
    from ..models.cost import Chip

__all__ = ["DEFAULT_ALGORITHMS", "DEFAULT_FORMATS", "DEFAULT_SIZES", "HOST_MEMORY",
           "HOST_START_CPU_S", "measured_chip", "run", "worker_env"]

DEFAULT_ALGORITHMS = ("ring", "bidir_ring", "two_shot")
DEFAULT_FORMATS = BYTE_LADDER
DEFAULT_SIZES = tuple(1 << (20 + i) for i in range(7))  # 1 MiB .. 64 MiB per host
HOST_MEMORY = 768 << 20  # peak resident bytes of one host besides its messages, with a margin
HOST_START_CPU_S = 1.0  # CPU seconds for one host to import JAX and start, with a margin
_PORT = 12355  # coordinator port inside a fresh namespace (loopback: a free one is picked)
_PORT_TAKEN = re.compile(r"(?i)address already in use|failed to (start rpc server|add port)")
_POLL_S = 0.2


class PortTaken(RuntimeError):
    """The coordinator (worker 0) could not bind its port."""


def worker_env(base: dict | None = None) -> dict:
    """The workers' environment: `base` (default this process's) on purpose: CPU only, this
    package first on the path, and without what would give a host several devices
    (`--xla_force_host_platform_device_count` in XLA_FLAGS, JAX_NUM_CPU_DEVICES)."""
    env = dict(os.environ if base is None else base)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env["JAX_PLATFORMS"] = "cpu"
    flags = [f for f in env.pop("XLA_FLAGS", "").split() if not f.startswith(DEVICE_COUNT_FLAG)]
    if flags:
        env["XLA_FLAGS"] = " ".join(flags)
    env.pop("JAX_NUM_CPU_DEVICES", None)
    return env


class _Run:
    """Workers, network and guardian of one run; `close()` removes all of them."""

    def __init__(self, hosts: int, rate: str | None, deadline: float):
        self.hosts, self.deadline = hosts, deadline
        self.net = network.names(str(os.getpid()), hosts) if rate else None
        self.tmp = tempfile.mkdtemp(prefix="equarx-multihost-")
        self.workers: list[subprocess.Popen] = []
        self.logs: list[str] = []
        self.guardian = subprocess.Popen(
            [sys.executable, "-c", network.GUARDIAN, network.__file__],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        if self.guardian.stdout.readline().strip() != "ready":
            raise RuntimeError("the cleanup guardian did not start")
        self._tell(net=self.net, tmp=self.tmp,
                   deadline=time.time() + max(0.0, deadline - time.monotonic()) + 30)
        if rate:
            network.make_network(self.net, rate, deadline)

    def _tell(self, **msg) -> None:
        self.guardian.stdin.write(json.dumps(msg) + "\n")
        self.guardian.stdin.flush()

    def spawn(self, args: list[str], host: int | None = None, env: dict | None = None):
        self.check_deadline()
        prefix = ["ip", "netns", "exec", self.net["netns"][host]] if self.net and host is not None \
            else []
        self.logs.append(os.path.join(self.tmp, f"log{len(self.logs)}.txt"))
        with open(self.logs[-1], "w", encoding="utf-8") as log:
            proc = subprocess.Popen(
                [*prefix, sys.executable, "-m", "equarx_ref.multihost", *args, str(os.getpid())],
                env=worker_env() if env is None else env, stdout=subprocess.PIPE, stderr=log,
                stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        self.workers.append(proc)
        self._tell(pgids=[proc.pid])
        return proc

    def check_deadline(self) -> None:
        if time.monotonic() > self.deadline:
            raise TimeoutError("the multi-host run passed its time limit (--timeout); all "
                               "hosts were stopped")

    def tail(self, i: int, lines: int = 12) -> str:
        with open(self.logs[i], encoding="utf-8", errors="replace") as f:
            return "".join(f.readlines()[-lines:])

    def wait(self, progress=None, names=None) -> None:
        """Until every worker exits; worker 0's "progress" lines go to `progress`. The first
        worker to fail ends the wait at once: RuntimeError naming it (`names[i]`) with the
        end of its log (PortTaken when it is the coordinator failing to bind). Of workers found
        failed together, one killed by a signal is named first: the others failed because it
        went away."""
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.workers[0].stdout],
                         daemon=True).start()
        while True:
            codes = [w.poll() for w in self.workers]
            # a worker killed by a signal is the cause: its peers then fail on the broken link
            failed = sorted((i for i, c in enumerate(codes) if c), key=lambda i: (codes[i] > 0, i))
            if failed:
                i = failed[0]
                name = names[i] if names else f"worker {i}"
                tail = self.tail(i)
                kind = PortTaken if i == 0 and _PORT_TAKEN.search(tail) else RuntimeError
                raise kind(f"multi-host {name} failed (exit {codes[i]}); the end of its log:\n"
                           f"{tail.rstrip()}")
            if all(c == 0 for c in codes):
                break
            self.check_deadline()
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=_POLL_S)
                if progress and line.startswith("progress"):
                    progress(line.split(" ", 1)[1].strip())

    def stop_workers(self) -> None:
        for w in self.workers:
            with contextlib.suppress(OSError):
                os.killpg(w.pid, signal.SIGKILL)
        for w in self.workers:
            w.wait()
            if w.stdout:
                w.stdout.close()
        self.workers = []

    def close(self) -> None:
        self.stop_workers()
        network.teardown(self.net, [], self.tmp)
        self.guardian.stdin.close()  # the guardian repeats the teardown (a no-op) and exits
        self.guardian.wait(timeout=60)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _memory_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/meminfo", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("MemAvailable:"))
        return int(line.split()[1]) * 1024
    return None


def check_capacity(hosts: int, sizes, timeout: float) -> None:
    """ValueError with the reason when this machine cannot serve `hosts` hosts of `sizes`
    messages within `timeout` seconds (module essay)."""
    # inputs, results, and the wire buffers of every configuration, alive while timed together
    per_host = HOST_MEMORY + 16 * max(sizes)
    available = _memory_available()
    if available is not None and hosts * per_host > available:
        raise ValueError(f"{hosts} hosts need about {hosts * per_host / 2**30:.1f} GiB of "
                         f"memory ({per_host / 2**20:.0f} MiB each), over the "
                         f"{available / 2**30:.1f} GiB available here: fewer hosts or "
                         "smaller messages")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    start = hosts * HOST_START_CPU_S / max(1, cores or 1)
    if start > timeout / 2:
        raise ValueError(f"{hosts} hosts take about {start:.0f} s just to start on {cores} "
                         f"core(s), over half the {timeout:g} s limit: fewer hosts or a "
                         "larger --timeout")


def run(hosts: int, *, link: str | None = None, sizes=DEFAULT_SIZES,
        algorithms=DEFAULT_ALGORITHMS, formats=DEFAULT_FORMATS, repeats: int = 3,
        timeout: float = 600.0, progress: bool = True, check: bool = True) -> dict:
    """Run every algorithm x format x size as `hosts` processes of one JAX job (module essay).

    Args:
        hosts: processes (emulated hosts), at least 2, no more than this machine can serve.
        link: a tc rate ("100mbit", "1gbit") capping each host's link; needs root (network
            namespaces). None, or not root: loopback, uncapped (the result says which).
        sizes: message bytes per host (bf16 values x 2), each a multiple of 2.
        algorithms, formats: names as `all_reduce` and `parse_format` take them; the bf16
            ring is always run (the speedups are against it).
        repeats: timed calls per configuration (median kept); timeout: seconds for the whole
            run, network and reference included.
        progress: a progress line on stderr (tqdm if installed). check: also run one process
            with `hosts` simulated devices and require bitwise equal results.

    Returns:
        {"hosts", "network", "link", "chip", "calibration", "results": [row, ...]}: each row
        has algorithm, format, message_bytes, wire_bytes_per_device (from the compiled HLO),
        seconds, predicted_seconds, speedup_vs_bf16, link_seconds, compute_seconds,
        add_seconds, digest (sha256 prefix of the result) and bitwise_equal.

    Raises:
        ValueError/TypeError: a bad argument, or a run this machine cannot serve (up front).
        RuntimeError: a host failed (named, with the end of its log). TimeoutError: past
            `timeout`. Either way every host, namespace and link is gone.
    """
    from ..formats import format_label, parse_format
    from ..runs.progress import progress_bar
    from ..schedule import SCHEDULES

    start = time.monotonic()
    algorithms_ok = list(SCHEDULES)
    hosts = count(hosts, "hosts", minimum=2)
    repeats = count(repeats, "repeats")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
    if isinstance(sizes, (int, str)):
        raise TypeError(f"sizes must be a list of message sizes in bytes, got {sizes!r}")
    sizes = sorted({count(s, "message size (bytes)", minimum=2) for s in sizes})
    if not sizes or any(s % 2 for s in sizes):
        raise ValueError("sizes: give at least one, each an even number of bytes (bf16 values)")
    for a in algorithms:
        if a not in algorithms_ok:
            raise ValueError(f"unknown algorithm {a!r}; choose from {algorithms_ok}")
    formats = [format_label(parse_format(f)) for f in formats]
    configs = [("ring", UNQUANTIZED)] + [(a, f) for a in algorithms for f in formats
                                         if (a, f) != ("ring", UNQUANTIZED)]
    rate = network.parse_rate(link) if link is not None else None
    if rate and os.geteuid() != 0:
        print("equarx-ref: --link needs root (network namespaces): running on loopback, "
              "uncapped", file=sys.stderr)
        link = rate = None
    if rate:  # refuse what cannot finish in time: the bytes alone at the link rate
        from ..models.predict import wire_bytes

        need = sum((repeats + 2) * wire_bytes(s // 2, hosts, fmt=parse_format(f), algorithm=a)
                   for s in sizes for a, f in configs) * 8 / rate
        if need > timeout:
            raise ValueError(f"at {link} the bytes alone need about {need:.0f} s, over the "
                             f"{timeout:.0f} s limit: fewer sizes or configurations, or a "
                             "larger --timeout")
    check_capacity(hosts, sizes, timeout)
    spec = {"hosts": hosts, "sizes": sizes, "configs": configs, "repeats": repeats,
            "timeout": timeout}
    net_text = (f"{hosts} network namespaces, veth links into a bridge, each capped at {link} "
                f"(tc tbf)" if rate else f"{hosts} processes on loopback, uncapped")
    bar = progress_bar(len(sizes) * (len(configs) + repeats) + check, progress, unit="step",
                       desc=f"{hosts} hosts" + (f" at {link}" if link else ""))
    job, sigterm = None, None
    if threading.current_thread() is threading.main_thread():  # SIGTERM: clean up, then exit
        sigterm = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        job = _Run(hosts, link if rate else None, start + timeout)
        spec_path = os.path.join(job.tmp, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        names = [f"worker {i}" for i in range(hosts)]
        outs = [os.path.join(job.tmp, f"host{i}.json") for i in range(hosts)]
        taken = []
        while True:
            port = _PORT if rate else _free_port()
            for i in range(hosts):
                job.spawn(["worker", spec_path, f"{network.SUBNET}.1:{port}" if rate
                           else f"127.0.0.1:{port}", str(i), outs[i]], host=i)
            try:
                job.wait(bar, names)
                break
            except PortTaken as e:
                job.stop_workers()
                taken.append(port)
                if rate or len(taken) == 3:
                    raise RuntimeError(f"the coordinator could not bind its port (tried "
                                       f"{', '.join(map(str, taken))}: taken); free one, or try "
                                       f"again. Worker 0's log ends:\n"
                                       f"{str(e).splitlines()[-1]}") from None
        per_host = []
        for out in outs:
            with open(out, encoding="utf-8") as f:
                per_host.append(json.load(f))
        reference = None
        if check:
            job.stop_workers()
            job.spawn(["reference", spec_path, os.path.join(job.tmp, "reference.json")])
            job.wait(names=["single-process reference"])
            bar("single-process reference")
            with open(os.path.join(job.tmp, "reference.json"), encoding="utf-8") as f:
                reference = json.load(f)
    finally:
        bar(None)
        if job:
            job.close()
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return _report(spec, per_host, reference, link if rate else None, net_text)


def measured_chip(calibration: dict, fmt: str, *, name: str = "emulated hosts",
                  source: str = "measured") -> Chip:
    """The `Chip` a run's `calibration` (its report's "calibration") prices a `fmt` row with.

    Hosts on a switch (links=1); the link, latency and memory figures as measured; each
    collective primitive at its own measured rate; fresh pages at theirs; and the row's hop
    (`codec_bytes_per_s FMT`) at its own: a quantized format's as the codec, bf16's (the
    unquantized hop, the one memory pass of its reduce-scatter) as the memory rate. Runs
    stored before a figure was measured fall back to the link or memory rate for it (and
    leave fresh pages unpriced).
    """
    from ..models.cost import Chip

    hop = calibration.get(f"codec_bytes_per_s {fmt}")
    memory = calibration["memory_bytes_per_s"]
    return Chip(name, link_bandwidth=calibration["link_bytes_per_s"],
                hop_latency=calibration["hop_latency_s"],
                hbm_bandwidth=hop if fmt == UNQUANTIZED and hop else memory,
                peak_flops=1.0, links=1, source=source,
                codec_bandwidth=None if fmt == UNQUANTIZED else hop,
                fresh_bandwidth=calibration.get("fresh_bytes_per_s"),
                primitive_bandwidth={k.split()[1]: v for k, v in calibration.items()
                                     if k.startswith("primitive_bytes_per_s ")})


def _report(spec: dict, per_host: list[dict], reference: dict | None, link, net_text) -> dict:
    """Rows from the hosts' timings: the slowest host per repeat, median over repeats."""
    from ..formats import parse_format
    from ..models.cost import predicted_time

    cal = {k: statistics.median(h["calibration"][k] for h in per_host)
           for k in per_host[0]["calibration"]}
    name = f"{spec['hosts']} emulated hosts ({link or 'loopback'})"
    source = f"measured in this run: {net_text}"
    chip = measured_chip(cal, UNQUANTIZED, name=name, source=source)

    def slowest(key):  # median over repeats of the slowest host's time
        return statistics.median(map(max, zip(*(h["times"][key] for h in per_host),
                                              strict=True)))

    rows = []
    for j, r in enumerate(per_host[0]["runs"]):
        key, n = r["key"], r["message_bytes"] // 2
        digests = {h["runs"][j]["digest"] for h in per_host}  # every host runs the same list
        rows.append({
            "algorithm": r["algorithm"], "format": r["format"],
            "message_bytes": r["message_bytes"],
            "wire_bytes_per_device": r["hlo_bytes"],
            "seconds": slowest(key),
            "predicted_seconds": predicted_time(
                n, spec["hosts"], fmt=parse_format(r["format"]), algorithm=r["algorithm"],
                chip=measured_chip(cal, r["format"], name=name, source=source)),
            "link_seconds": slowest(key + " wire"),
            "add_seconds": slowest(f"add {r['message_bytes']}"),
            "model_bytes_per_device": r["model_bytes"], "digest": r["digest"],
            "link_bytes_per_device": r["wire_hlo_bytes"],
            "bitwise_equal": len(digests) == 1 and (
                reference is None or reference["digests"][key] in digests),
        })
    base = {r["message_bytes"]: r["seconds"] for r in rows
            if (r["algorithm"], r["format"]) == ("ring", UNQUANTIZED)}
    for r in rows:
        r["speedup_vs_bf16"] = base[r["message_bytes"]] / r["seconds"]
        r["compute_seconds"] = max(0.0, r["seconds"] - r["link_seconds"])
    return {"hosts": spec["hosts"], "network": net_text, "link": link,
            "repeats": spec["repeats"], "checked_against_one_process": reference is not None,
            "chip": {"link_bandwidth": chip.link_bandwidth, "hop_latency": chip.hop_latency,
                     "hbm_bandwidth": chip.hbm_bandwidth,
                     "fresh_bandwidth": chip.fresh_bandwidth, "source": chip.source,
                     "primitive_bandwidth": dict(chip.primitive_bandwidth)},
            "calibration": cal, "results": rows}
