"""Multi-host: the same AllReduce as N processes of one JAX job, over real sockets and links.

Simulated devices share memory, so they time the quantizer, never a link. Here every emulated
host is its own process: `jax.distributed.initialize` joins N of them into one job with one CPU
device each, and XLA:CPU runs the collectives through gloo over TCP. The program is unchanged:
`all_reduce` inside `jax.shard_map` over the N-device mesh, so the results must be, and are
checked to be, bitwise those of one process with N simulated devices.

The links. As root, with a rate (`link="1gbit"`), each host gets a network namespace of its own
with one veth link into a bridge, and `tc tbf` caps what it sends at that rate: hosts on a switch.
gloo binds to the address the host name resolves to, so each namespace's `/etc/netns/NAME/hosts`
maps the name to that host's own address (`ip netns exec` mounts it over `/etc/hosts`). Only
these namespaces and loopback are used; the root namespace gets no address in their subnet.
Without root (or without a rate) the hosts talk over loopback, uncapped, and the report says so.

Cleaning up. Namespaces, links, the bridge, the hosts files and the worker processes are removed
after success, failure, Ctrl-C or SIGTERM by the launcher, and after a `kill -9` of the launcher
by a guardian: a small process in a session of its own that was told every resource before it
was made and tears them all down when the launcher's pipe closes (which the kernel does when the
launcher dies) or when the run's deadline passes. Every run is bounded in time.

What is timed, per algorithm x format x message size (each host contributes `message_bytes` of
bf16): the AllReduce, each host starting together after a barrier, the slowest host's time
kept, median over repeats; the same run's sends alone (the same collectives on ready-made byte
buffers of the sizes the AllReduce sends: the link part; the rest is compute, since XLA:CPU
does not overlap the two); and a plain add over the message. The time model `cost.predicted_time`
gets a `Chip` made of this run's own figures:

    link_bandwidth  bytes/s of a large ppermute around the ring, all hosts sending at once
    hop_latency     half the round trip of a small message
    hbm_bandwidth   bytes/s (read + written) of `x + 1` on one host while the others run it too
    codec_bandwidth per format, the same bytes/s of one ring hop (dequantize what arrives, add
                    the local bf16 chunk, quantize the sum) over 4M values, all hosts at once:
                    exact rounding makes quantizing compute bound on a CPU, unlike `x + 1`

Run it from the command line: `equarx-ref bench --hosts 4 --link 1gbit --mib 32`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import queue
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from ._checks import count

__all__ = ["DEFAULT_ALGORITHMS", "DEFAULT_FORMATS", "DEFAULT_SIZES", "parse_rate", "plot", "run"]

DEFAULT_ALGORITHMS = ("ring", "bidir_ring", "two_shot")
DEFAULT_FORMATS = ("bf16", "int8", "int4")
DEFAULT_SIZES = tuple(1 << (20 + i) for i in range(7))  # 1 MiB .. 64 MiB per host
_SUBNET = "10.213.0"  # private, and private to each run: only its namespaces hold it
_PORT = 12355  # coordinator port inside a fresh namespace (loopback: a free one is picked)
_RATE = re.compile(r"^(\d+(?:\.\d+)?)([kmg]?)bit$")


def parse_rate(text: str) -> float:
    """A tc rate such as "100mbit", "1gbit", "2.5gbit" -> bits per second."""
    m = _RATE.match(text.strip().lower())
    if not m or float(m[1]) <= 0:
        raise ValueError(f"link rate must look like 100mbit or 1gbit (tc syntax), got {text!r}")
    return float(m[1]) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m[2]]


# ---- the network: one namespace per host, veths into a bridge, a tbf cap on each host --------


def _names(tag: str, hosts: int) -> dict:
    """Everything a run may create, named before anything is made (so it can be removed)."""
    return {"netns": [f"eqx{tag}h{i}" for i in range(hosts)],
            "veths": [f"eqx{tag}v{i}" for i in range(hosts)],
            "bridge": f"eqx{tag}br", "etc": [f"/etc/netns/eqx{tag}h{i}" for i in range(hosts)]}


def _ip(*args: str, check: bool = True) -> str:
    out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if check and out.returncode:
        raise RuntimeError(f"ip {' '.join(args)}: {out.stderr.strip()}")
    return out.stdout


def _make_network(net: dict, rate: str) -> None:
    _ip("link", "add", net["bridge"], "type", "bridge")
    _ip("link", "set", net["bridge"], "up")
    for i, (ns, veth, etc) in enumerate(zip(net["netns"], net["veths"], net["etc"], strict=True)):
        _ip("netns", "add", ns)
        peer = veth + "p"
        _ip("link", "add", veth, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", ns)
        _ip("-n", ns, "link", "set", peer, "name", "eth0")
        _ip("-n", ns, "addr", "add", f"{_SUBNET}.{i + 1}/24", "dev", "eth0")
        for dev in ("lo", "eth0"):
            _ip("-n", ns, "link", "set", dev, "up")
        _ip("link", "set", veth, "master", net["bridge"])
        _ip("link", "set", veth, "up")
        _ip("netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate",
            rate, "burst", "128kb", "latency", "50ms")
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "hosts"), "w", encoding="utf-8") as f:
            f.write(f"127.0.0.1 localhost\n{_SUBNET}.{i + 1} {socket.gethostname()}\n")


def _teardown(net: dict | None, pgids, tmp: str | None) -> None:
    """Kill the workers, remove every resource of `net`; safe to repeat, never raises."""
    for g in pgids:
        with contextlib.suppress(OSError):
            os.killpg(g, signal.SIGKILL)
    if net:
        for ns in net["netns"]:
            for pid in _ip("netns", "pids", ns, check=False).split():
                with contextlib.suppress(OSError, ValueError):
                    os.kill(int(pid), signal.SIGKILL)
        for veth in net["veths"]:
            _ip("link", "del", veth, check=False)
        _ip("link", "del", net["bridge"], check=False)
        for ns in net["netns"]:
            _ip("netns", "del", ns, check=False)
        for etc in net["etc"]:
            shutil.rmtree(etc, ignore_errors=True)
    if tmp:
        shutil.rmtree(tmp, ignore_errors=True)


def leftovers(net: dict) -> list[str]:
    """Resources of `net` that still exist (empty after every run)."""
    links = _ip("-o", "link", "show", check=False)
    return ([ns for ns in net["netns"] if ns in _ip("netns", "list", check=False).split()]
            + [d for d in (*net["veths"], net["bridge"]) if f" {d}:" in links or f" {d}@" in links]
            + [e for e in net["etc"] if os.path.exists(e)])


def _guard() -> None:
    """The guardian (`python -m equarx_ref.multihost guard`): reads the resources (JSON lines)
    from stdin; at EOF (the launcher finished or died) or at the deadline, removes them all."""
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
    _teardown(state["net"], state["pgids"], state["tmp"])


# ---- the launcher --------------------------------------------------------------------------


class _Run:
    """Workers, network and guardian of one run; `close()` removes all of them."""

    def __init__(self, hosts: int, rate: str | None, timeout: float):
        self.hosts, self.deadline = hosts, time.monotonic() + timeout
        self.net = _names(str(os.getpid()), hosts) if rate else None
        self.tmp = tempfile.mkdtemp(prefix="equarx-multihost-")
        self.workers: list[subprocess.Popen] = []
        self.guardian = subprocess.Popen(
            [sys.executable, "-m", "equarx_ref.multihost", "guard"], env=_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True)
        if self.guardian.stdout.readline().strip() != "ready":
            raise RuntimeError("the cleanup guardian did not start")
        self._tell(net=self.net, tmp=self.tmp, deadline=time.time() + timeout + 30)
        if rate:
            _make_network(self.net, rate)

    def _tell(self, **msg) -> None:
        self.guardian.stdin.write(json.dumps(msg) + "\n")
        self.guardian.stdin.flush()

    def spawn(self, args: list[str], host: int | None = None) -> subprocess.Popen:
        prefix = ["ip", "netns", "exec", self.net["netns"][host]] if self.net and host is not None \
            else []
        log = open(os.path.join(self.tmp, f"log{len(self.workers)}.txt"), "w")
        proc = subprocess.Popen([*prefix, sys.executable, "-m", "equarx_ref.multihost", *args,
                                 str(os.getpid())],
                                env=_env(), stdout=subprocess.PIPE, stderr=log, text=True,
                                start_new_session=True)
        log.close()
        self.workers.append(proc)
        self._tell(pgids=[proc.pid])
        return proc

    def wait(self, progress=None) -> None:
        """Until every worker exits; worker 0's stdout lines go to `progress`. Errors name the
        first worker that failed and show the end of its log."""
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x) for x in self.workers[0].stdout],
                         daemon=True).start()
        while any(w.poll() is None for w in self.workers):
            if any(w.poll() for w in self.workers):
                break  # one failed: the others would wait for it forever
            if time.monotonic() > self.deadline:
                raise TimeoutError("the multi-host run passed its time limit (--timeout); "
                                   "all hosts were stopped")
            with contextlib.suppress(queue.Empty):
                line = lines.get(timeout=0.2)
                if progress and line.startswith("progress"):
                    progress(line.split(" ", 1)[1].strip())
        for i, w in enumerate(self.workers):
            if w.poll():  # the first that failed (the others may be stuck waiting for it)
                with open(os.path.join(self.tmp, f"log{i}.txt"), encoding="utf-8") as f:
                    tail = "".join(f.readlines()[-12:])
                raise RuntimeError(f"multi-host worker {i} failed (exit {w.returncode}):\n{tail}")
        for w in self.workers:
            w.wait()

    def close(self) -> None:
        for w in self.workers:
            with contextlib.suppress(OSError):
                os.killpg(w.pid, signal.SIGKILL)
            w.wait()
        _teardown(self.net, [], self.tmp)
        self.guardian.stdin.close()  # the guardian repeats the teardown (a no-op) and exits
        self.guardian.wait(timeout=60)


def _env() -> dict:
    """The launcher's environment, this package first on the path, CPU only."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, "JAX_PLATFORMS": "cpu"}


def _die_with(launcher: int) -> None:
    """Get SIGKILL when the launcher dies (Linux PR_SET_PDEATHSIG); if it already has, exit."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != launcher:
        os._exit(4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(hosts: int, *, link: str | None = None, sizes=DEFAULT_SIZES,
        algorithms=DEFAULT_ALGORITHMS, formats=DEFAULT_FORMATS, repeats: int = 3,
        timeout: float = 600.0, progress: bool = True, check: bool = True) -> dict:
    """Run every algorithm x format x size as `hosts` processes of one JAX job (module essay).

    Args:
        hosts: processes (emulated hosts), at least 2.
        link: a tc rate ("100mbit", "1gbit") capping each host's link; needs root (network
            namespaces). None, or not root: loopback, uncapped (the result says which).
        sizes: message bytes per host (bf16 values x 2), each a multiple of 2.
        algorithms, formats: names as `all_reduce` and `parse_format` take them; the bf16
            ring is always run (the speedups are against it).
        repeats: timed calls per configuration (median kept); timeout: seconds for the whole run.
        progress: a tqdm bar on stderr. check: also run one process with `hosts` simulated
            devices and require bitwise equal results.

    Returns:
        {"hosts", "network", "link", "chip", "calibration", "results": [row, ...]}: each row
        has algorithm, format, message_bytes, wire_bytes_per_device (from the compiled HLO),
        seconds, predicted_seconds, speedup_vs_bf16, link_seconds, compute_seconds,
        add_seconds, digest (sha256 prefix of the result) and bitwise_equal.
    """
    from .formats import format_label, parse_format
    from .schedule import ALGORITHMS

    algorithms_ok = [a for a in ALGORITHMS if a != "psum"]
    hosts = count(hosts, "hosts", minimum=2)
    repeats = count(repeats, "repeats")
    sizes = sorted({count(s, "message size (bytes)", minimum=2) for s in sizes})
    if any(s % 2 for s in sizes):
        raise ValueError("message sizes are bytes of bf16 values: use even sizes")
    for a in algorithms:
        if a not in algorithms_ok:
            raise ValueError(f"unknown algorithm {a!r}; choose from {algorithms_ok}")
    formats = [format_label(parse_format(f)) for f in formats]
    configs = [("ring", "bf16")] + [(a, f) for a in algorithms for f in formats
                                    if (a, f) != ("ring", "bf16")]
    rate = parse_rate(link) if link is not None else None
    if rate and os.geteuid() != 0:
        print("equarx-ref: --link needs root (network namespaces): running on loopback, "
              "uncapped", file=sys.stderr)
        link = rate = None
    if rate:  # refuse what cannot finish in time: the bytes alone at the link rate
        from .models.predict import wire_bytes

        need = sum((repeats + 2) * wire_bytes(s // 2, hosts, fmt=parse_format(f), algorithm=a)
                   for s in sizes for a, f in configs) * 8 / rate
        if need > timeout:
            raise ValueError(f"at {link} the bytes alone need about {need:.0f} s, over the "
                             f"{timeout:.0f} s limit: fewer sizes or configurations, or a "
                             "larger --timeout")
    spec = {"hosts": hosts, "sizes": sizes, "configs": configs, "repeats": repeats,
            "timeout": timeout}
    network = (f"{hosts} network namespaces, veth links into a bridge, each capped at {link} "
               f"(tc tbf)" if rate else f"{hosts} processes on loopback, uncapped")
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(sizes) * len(configs) + 1, unit="run", leave=False,
                   desc=f"{hosts} hosts" + (f" at {link}" if link else ""))
    job, sigterm = None, None
    if threading.current_thread() is threading.main_thread():  # SIGTERM: clean up, then exit
        sigterm = signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        job = _Run(hosts, link if rate else None, timeout)
        spec_path = os.path.join(job.tmp, "spec.json")
        with open(spec_path, "w", encoding="utf-8") as f:
            json.dump(spec, f)
        coordinator = f"{_SUBNET}.1:{_PORT}" if rate else f"127.0.0.1:{_free_port()}"
        for i in range(hosts):
            job.spawn(["worker", spec_path, coordinator, str(i),
                       os.path.join(job.tmp, f"host{i}.json")], host=i)
        job.wait(lambda text: bar and (bar.set_postfix_str(text), bar.update()))
        per_host = []
        for i in range(hosts):
            with open(os.path.join(job.tmp, f"host{i}.json"), encoding="utf-8") as f:
                per_host.append(json.load(f))
        reference = None
        if check:
            if bar:
                bar.set_postfix_str("single-process reference")
            job.spawn(["reference", spec_path, os.path.join(job.tmp, "reference.json")])
            job.workers = job.workers[-1:]
            job.wait()
            with open(os.path.join(job.tmp, "reference.json"), encoding="utf-8") as f:
                reference = json.load(f)
    finally:
        if bar:
            bar.close()
        if job:
            job.close()
        if sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)
    return _report(spec, per_host, reference, link if rate else None, network)


def _report(spec: dict, per_host: list[dict], reference: dict | None, link, network) -> dict:
    """Rows from the hosts' timings: the slowest host per repeat, median over repeats."""
    from .formats import parse_format
    from .models.cost import Chip, predicted_time

    cal = {k: statistics.median(h["calibration"][k] for h in per_host)
           for k in per_host[0]["calibration"]}
    chip = Chip(f"{spec['hosts']} emulated hosts ({link or 'loopback'})",
                link_bandwidth=cal["link_bytes_per_s"], hop_latency=cal["hop_latency_s"],
                hbm_bandwidth=cal["memory_bytes_per_s"], peak_flops=1.0, links=1,
                source=f"measured in this run: {network}")

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
                chip=dataclasses.replace(chip, codec_bandwidth=cal.get(
                    f"codec_bytes_per_s {r['format']}"))),
            "link_seconds": slowest(key + " wire"),
            "add_seconds": slowest(f"add {r['message_bytes']}"),
            "model_bytes_per_device": r["model_bytes"], "digest": r["digest"],
            "link_bytes_per_device": r["wire_hlo_bytes"],
            "bitwise_equal": len(digests) == 1 and (
                reference is None or reference["digests"][key] in digests),
        })
    base = {r["message_bytes"]: r["seconds"] for r in rows
            if (r["algorithm"], r["format"]) == ("ring", "bf16")}
    for r in rows:
        r["speedup_vs_bf16"] = base[r["message_bytes"]] / r["seconds"]
        r["compute_seconds"] = max(0.0, r["seconds"] - r["link_seconds"])
    return {"hosts": spec["hosts"], "network": network, "link": link,
            "repeats": spec["repeats"], "checked_against_one_process": reference is not None,
            "chip": {"link_bandwidth": chip.link_bandwidth, "hop_latency": chip.hop_latency,
                     "hbm_bandwidth": chip.hbm_bandwidth, "source": chip.source},
            "calibration": cal, "results": rows}


# ---- the worker: one host of the job, and the single-process reference ----------------------


def _inputs(n: int, host: int):
    """Host `host`'s message: n bf16 values, N(0, 1), the same in every run."""
    import ml_dtypes
    import numpy as np

    rng = np.random.default_rng([20250617, host])
    return rng.standard_normal(n, dtype=np.float32).astype(ml_dtypes.bfloat16)


def _programs(mesh, algorithm: str, fmt_name: str, n: int):
    """The AllReduce and its sends alone (jitted shard_maps over `mesh`'s axis "h"), and the
    byte sizes of the messages the second one takes."""
    import jax
    from jax import lax
    from jax.sharding import PartitionSpec as P

    from .collectives import all_reduce
    from .formats import parse_format
    from .quantize import encoded_bytes
    from .schedule import layout, make_schedule

    fmt, p = parse_format(fmt_name), mesh.shape["h"]
    reduce = jax.jit(jax.shard_map(
        lambda v: all_reduce(v[0], "h", fmt=fmt, algorithm=algorithm, min_bytes=0),
        mesh=mesh, in_specs=P("h"), out_specs=P()))
    # the messages all_reduce sends, step by step (collectives._reduce/_gather_phase)
    sched = make_schedule(algorithm, (p,))
    m = layout(n, sched.chunk_count, fmt.block_size if fmt else 1)[0]
    enc = lambda values: encoded_bytes(values, fmt, "bfloat16")  # noqa: E731
    owned = sum(1 for own in sched.owners if 0 in own)
    sizes = [("permute", enc(len(s.transfers[0].chunks) * m), s.transfers)
             if s.kind == "permute" else
             ("all_to_all", sched.chunk_count * enc(m)) if s.kind == "all_to_all" else
             ("all_gather", enc(m) * (owned if s.phase == "gather" else sched.chunk_count))
             for s in sched.steps]

    def wire(*bufs):  # one uint8 [1, size] buffer per message; each result is an output, so
        got = []      # XLA can neither drop a send nor shrink it to the bytes used
        for (kind, _, *pairs), msg in zip(sizes, bufs, strict=True):
            if kind == "permute":
                got.append(lax.ppermute(msg, "h", [(t.src, t.dst) for t in pairs[0]]))
            elif kind == "all_to_all":
                got.append(lax.all_to_all(msg.reshape(p, -1), "h", 0, 0).reshape(1, -1))
            else:
                got.append(lax.all_gather(msg, "h", axis=1, tiled=True))
        return tuple(got)

    sends = jax.jit(jax.shard_map(wire, mesh=mesh, in_specs=P("h"), out_specs=P("h"),
                                  check_vma=False))
    return reduce, sends, [size for _, size, *_ in sizes]


def _digest(y) -> str:
    import numpy as np

    return hashlib.sha256(np.asarray(y).tobytes()).hexdigest()[:16]


def _worker(spec_path: str, coordinator: str, host: int, out: str) -> None:
    """One host: join the job, calibrate, time every configuration, write `out` (JSON)."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    threading.Timer(spec["timeout"], os._exit, (3,)).start()  # bounded, even if gloo hangs
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, spec["hosts"], host,
                               initialization_timeout=int(min(spec["timeout"], 300)))
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from .formats import UNQUANTIZED, parse_format
    from .models.hlo import hlo_wire_bytes
    from .models.predict import wire_bytes
    from .quantize import decode, encode

    p = spec["hosts"]
    mesh = jax.make_mesh((p,), ("h",), devices=jax.devices())
    rows = NamedSharding(mesh, P("h"))
    times: dict[str, list[float]] = {}

    def timed(key, fn, *args, repeats=spec["repeats"]):
        jax.block_until_ready(fn(*args))  # compile, warm up
        for _ in range(repeats):
            multihost_utils.sync_global_devices("timed")
            t0 = time.perf_counter()
            jax.block_until_ready(fn(*args))
            times.setdefault(key, []).append(time.perf_counter() - t0)
        return statistics.median(times[key])

    def global_array(local):
        return jax.make_array_from_process_local_data(rows, local[None], (p, *local.shape))

    # calibration: memory, latency, link (module essay)
    x = jnp.zeros(1 << 24, jnp.float32)
    memory = 2 * x.nbytes / timed("memory", jax.jit(lambda v: v + 1), x, repeats=5)
    tiny = global_array(np.zeros(8, np.uint8))
    right, left = [(i, (i + 1) % p) for i in range(p)], [((i + 1) % p, i) for i in range(p)]
    trips = 50
    bounce = jax.jit(jax.shard_map(lambda v: jax.lax.fori_loop(
        0, trips, lambda _, b: jax.lax.ppermute(jax.lax.ppermute(b, "h", right), "h", left), v),
        mesh=mesh, in_specs=P("h"), out_specs=P("h")))
    latency = timed("latency", bounce, tiny, repeats=5) / (2 * trips)
    block = global_array(np.ones(8 << 20, np.uint8))
    shift = jax.jit(jax.shard_map(lambda v: jax.lax.ppermute(v, "h", right), mesh=mesh,
                                  in_specs=P("h"), out_specs=P("h")))
    link = (8 << 20) / max(timed("link", shift, block) - latency, 1e-9)
    codec = {}  # per format: the bytes/s of one ring hop's dequantize-add-quantize pass
    m = 1 << 22
    local = jnp.ones(m, jnp.bfloat16)
    for name in sorted({fmt for _, fmt in spec["configs"]} - {UNQUANTIZED}):
        f = parse_format(name)
        wire = encode(jnp.ones(m, jnp.float32), f)
        hop = jax.jit(lambda w, v, f=f: encode(decode(w, f, m) + v.astype(jnp.float32), f))
        codec[name] = (2 * wire.size + local.nbytes) / timed(f"codec {name}", hop, wire, local,
                                                              repeats=5)

    runs, total, done = [], len(spec["sizes"]) * len(spec["configs"]), 0
    for nbytes in spec["sizes"]:
        n = nbytes // 2
        x = global_array(_inputs(n, host))
        timed(f"add {nbytes}", jax.jit(lambda a: a + a), x.addressable_data(0))
        for algorithm, fmt in spec["configs"]:
            key = f"{algorithm} {fmt} {nbytes}"
            reduce, sends, message_sizes = _programs(mesh, algorithm, fmt, n)
            compiled = reduce.lower(x).compile()
            timed(key, compiled, x)
            bufs = [global_array(np.ones(size, np.uint8)) for size in message_sizes]
            sends = sends.lower(*bufs).compile()
            timed(key + " wire", sends, *bufs)
            runs.append({"key": key, "algorithm": algorithm, "format": fmt,
                         "message_bytes": nbytes, "digest": _digest(
                             compiled(x).addressable_data(0)),
                         "hlo_bytes": round(sum(hlo_wire_bytes(compiled.as_text(), p).values())),
                         "wire_hlo_bytes": round(sum(hlo_wire_bytes(sends.as_text(), p).values())),
                         "model_bytes": wire_bytes(n, p, fmt=parse_format(fmt),
                                                   algorithm=algorithm)})
            done += 1
            if host == 0:
                print(f"progress {done}/{total} {algorithm} {fmt} {nbytes >> 20} MiB", flush=True)
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"calibration": {"memory_bytes_per_s": memory, "hop_latency_s": latency,
                                   "link_bytes_per_s": link,
                                   **{f"codec_bytes_per_s {k}": v for k, v in codec.items()}},
                   "times": times, "runs": runs}, f)
    jax.distributed.shutdown()
    os._exit(0)  # the timer thread must not keep us alive


def _reference(spec_path: str, out: str) -> None:
    """One process, `hosts` simulated CPU devices, the same inputs and programs: digests."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from .devices import make_mesh, setup_devices

    p = spec["hosts"]
    mesh = make_mesh(setup_devices(p), ("h",))
    digests = {}
    for nbytes in spec["sizes"]:
        x = jax.device_put(np.stack([_inputs(nbytes // 2, i) for i in range(p)]),
                           NamedSharding(mesh, P("h")))
        for algorithm, fmt in spec["configs"]:
            y = _programs(mesh, algorithm, fmt, nbytes // 2)[0](x)
            shards = {_digest(s.data) for s in y.addressable_shards}
            digests[f"{algorithm} {fmt} {nbytes}"] = shards.pop() if len(shards) == 1 else "!"
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"digests": digests}, f)


# ---- a figure ------------------------------------------------------------------------------


def plot(result: dict, path: str) -> None:
    """Measured seconds (markers) and the model's (lines) against message size; speedups."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    keys = dict.fromkeys((r["algorithm"], r["format"]) for r in result["results"])
    for i, key in enumerate(keys):
        rs = [r for r in result["results"] if (r["algorithm"], r["format"]) == key]
        mib = [r["message_bytes"] / 2**20 for r in rs]
        colour = f"C{i % 10}"
        ax.loglog(mib, [r["seconds"] for r in rs], "o", color=colour, label=" ".join(key))
        ax.loglog(mib, [r["predicted_seconds"] for r in rs], "-", color=colour, alpha=0.6)
        ax2.semilogx(mib, [r["speedup_vs_bf16"] for r in rs], "o-", color=colour)
    ax.set(xlabel="message per host (MiB)", ylabel="seconds per AllReduce",
           title="measured (dots) and modelled (lines)")
    ax2.set(xlabel="message per host (MiB)", ylabel="speedup over the bf16 ring",
            title=result["network"][:60])
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "guard":
        _guard()
    elif cmd in ("worker", "reference"):
        _die_with(int(rest.pop()))
        _worker(rest[0], rest[1], int(rest[2]), rest[3]) if cmd == "worker" else _reference(*rest)
    else:
        sys.exit(f"usage: python -m equarx_ref.multihost guard|worker|reference ...; got {cmd!r}")
