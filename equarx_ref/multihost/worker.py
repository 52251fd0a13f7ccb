"""One host of a multi-host run, and the single-process reference it is checked against.

Each emulated host is a process: `jax.distributed.initialize` joins N of them into one job with
one CPU device each, and XLA:CPU runs the collectives through gloo over TCP. The program is the
library's, unchanged: `all_reduce` inside `jax.shard_map` over the N-device mesh "h". So the
results must be, and are checked to be, bitwise those of one process with N simulated devices
(`reference`): each result's sha256 prefix is compared.

What a host measures (all hosts at once, each call after a barrier, `runs.timing`):

    memory    bytes/s (read + written) of `x + 1` over 16 MiB, warm (the result's buffer is
              reused from call to call): the model's hbm_bandwidth
    fresh     bytes/s of first touching fresh pages: `x + 1` over 64 MiB, whose result
              (past `cost.FRESH_BYTES`) malloc maps anew on every call, less its memory pass at
              the rate above: fresh_bandwidth. Chapter 05 prints what it explains, from the
              stored runs: a plain add over a large message at the warm memory rate alone,
              and with the fresh pages of its result
    latency   the fixed cost of one ring step: the one-way permute below timed again at the
              run's smallest step (at most 1/16 of the largest), fitted as latency + bytes /
              rate (clipped at 0): hop_latency. An 8-byte ping-pong, used before, put it far
              above what a ring step pays beyond its bytes, so the model ran slow at 1 MiB. On
              a capped link the fit comes out near 0: tc tbf's 128 kB burst lets the small
              permute through at full speed
    link      bytes/s of the one-way permute below: link_bandwidth
    primitive per collective primitive of the model (`cost.PRIMITIVES`), bytes/s sent per host
              through it, its hops' latency taken off, each at the size it carries in the
              run (the largest message M of bf16, at least 1 MiB per chunk): a one-way
              permute of M/p (the link above: a ring's step), a two-way one (M/2p each way),
              an all-to-all of M (two-shot's), an all-gather of M/p from each host (the gather
              phase's). The size matters: timed at one small size each, the primitives
              ran near the one-way rate on a capped link, yet two-shot's sends of a large
              message (an all-to-all of all of it) took markedly longer than those rates
              predicted
    codec     per format, bytes/s of one ring hop (dequantize what arrives, add the local bf16
              chunk, quantize the sum) over 4M values: exact rounding makes quantizing compute
              bound on a CPU, unlike `x + 1`; for bf16 the unquantized hop (bytes to bf16,
              add in f32, round to bf16, bytes), which is not one memory pass either

then, per message size, for every configuration the AllReduce and the same sends alone on
ready-made byte buffers (the link part; XLA:CPU does not overlap compute and sends, so the rest
is compute), and a plain add over the message, with the bytes each program sends read from its
compiled HLO. All of one size are timed round-robin (`time_calls`): the bf16 ring and the
quantized rows it is compared with take turns, so a drift of the link or the load over the
minutes of a run reaches them alike.

Failing fast. A host that fails prints its traceback to its log and exits at once (`os._exit`:
neither JAX's exit handlers, which wait for the other hosts, nor any thread may keep a dead host
alive); the launcher sees the exit within a fraction of a second and stops the run. A watchdog
(a daemon thread) ends a host that passes the run's time limit, even when gloo hangs, and each
host dies with the launcher (PR_SET_PDEATHSIG). The launcher starts it as
`python -m equarx_ref.multihost worker|reference ARGS... LAUNCHER_PID` (`main`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import statistics
import sys
import threading
import traceback
from functools import partial

__all__ = ["DEVICE_COUNT_FLAG", "reference", "worker"]

#: The XLA flag that splits one process into several CPU devices; a host must have one device.
DEVICE_COUNT_FLAG = "--xla_force_host_platform_device_count"


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

    from ..collectives import all_reduce
    from ..formats import parse_format
    from ..schedule import layout, make_schedule
    from ..wire import encoded_bytes

    fmt, p = parse_format(fmt_name), mesh.shape["h"]
    reduce = jax.jit(jax.shard_map(
        lambda v: all_reduce(v[0], "h", fmt=fmt, algorithm=algorithm, min_bytes=0),
        mesh=mesh, in_specs=P("h"), out_specs=P()))
    # the messages all_reduce sends, step by step (collectives._reduce/_gather_phase)
    sched = make_schedule(algorithm, (p,))
    m = layout(n, sched.chunk_count, fmt.row if fmt else 1)[0]
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


def _refuse_device_flags(host: int) -> None:
    """A host is one CPU device: refuse, naming it, a flag that would make it several (the
    launcher builds the workers' environment without it; this catches any other way in)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if DEVICE_COUNT_FLAG in flags or os.environ.get("JAX_NUM_CPU_DEVICES", "1") != "1":
        raise RuntimeError(
            f"host {host} was started with XLA_FLAGS={flags!r} / JAX_NUM_CPU_DEVICES="
            f"{os.environ.get('JAX_NUM_CPU_DEVICES')!r}: a host of a multi-host job must have "
            f"one CPU device, so {DEVICE_COUNT_FLAG} and JAX_NUM_CPU_DEVICES must not be set")


def worker(spec_path: str, coordinator: str, host: int, out: str) -> None:
    """One host: join the job, calibrate, time every configuration, write `out` (JSON)."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    _refuse_device_flags(host)
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator, spec["hosts"], host,
                               initialization_timeout=int(min(spec["timeout"], 300)))
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import multihost_utils
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ..formats import parse_format
    from ..models.cost import FRESH_BYTES, primitive_hops
    from ..models.hlo import hlo_wire_bytes
    from ..models.predict import wire_bytes
    from ..runs.timing import time_calls
    from ..wire import Codec, encoded_bytes

    p = spec["hosts"]
    if jax.process_count() != p or jax.local_device_count() != 1:
        raise RuntimeError(f"host {host}: the job has {jax.process_count()} processes and this "
                           f"one {jax.local_device_count()} devices; expected {p} and 1")
    mesh = jax.make_mesh((p,), ("h",), devices=jax.devices())
    rows = NamedSharding(mesh, P("h"))
    times: dict[str, list[float]] = {}

    def barrier():  # every host starts each timed call together
        multihost_utils.sync_global_devices("timed")

    def timed(key, fn, *args, repeats=spec["repeats"]):
        times.update(time_calls({key: lambda: fn(*args)}, repeats, before=barrier))
        return statistics.median(times[key])

    def global_array(local):
        return jax.make_array_from_process_local_data(rows, local[None], (p, *local.shape))

    # calibration: memory, fresh, latency, primitives, codec (module essay)
    add_one = jax.jit(lambda v: v + 1)
    warm, big = (jnp.zeros(nbytes // 4, jnp.float32) for nbytes in (FRESH_BYTES // 2,
                                                                    2 * FRESH_BYTES))
    memory = 2 * warm.nbytes / timed("memory", add_one, warm, repeats=5)
    fresh = big.nbytes / max(timed("fresh", add_one, big, repeats=5) - 2 * big.nbytes / memory,
                             1e-9)
    right, left = [(i, (i + 1) % p) for i in range(p)], [((i + 1) % p, i) for i in range(p)]
    chunk = max(max(spec["sizes"]) // p, 1 << 20) // 128 * 128  # a ring step's message
    small = max(min(min(spec["sizes"]) // p, chunk // 16) // 128 * 128, 128)
    primitives = {  # name: (the program, its input, bytes each host sends)
        "permute": (lambda v: jax.lax.ppermute(v, "h", right), chunk, chunk),
        "two_way_permute": (lambda v: jnp.concatenate([
            jax.lax.ppermute(v[:, :chunk // 2], "h", right),
            jax.lax.ppermute(v[:, chunk // 2:], "h", left)], axis=1), chunk, chunk),
        "all_to_all": (lambda v: jax.lax.all_to_all(v.reshape(p, -1), "h", 0, 0).reshape(1, -1),
                       chunk * p, chunk * (p - 1)),
        "all_gather": (lambda v: jax.lax.all_gather(v, "h", axis=1, tiled=True), chunk,
                       chunk * (p - 1))}

    def primitive(name, length):  # seconds of one call of a primitive on `length` bytes
        run = jax.jit(jax.shard_map(primitives[name][0], mesh=mesh, in_specs=P("h"),
                                    out_specs=P("h"), check_vma=False))
        return timed(f"primitive {name} {length}", run, global_array(np.ones(length, np.uint8)))

    seconds = {name: primitive(name, length) for name, (_, length, _) in primitives.items()}
    t_small = primitive("permute", small)  # the permute at two sizes: latency + bytes / rate
    latency = max(t_small - small * (seconds["permute"] - t_small) / (chunk - small), 0.0)
    bandwidth = {name: sent / max(seconds[name] - primitive_hops(name, p) * latency, 1e-9)
                 for name, (_, _, sent) in primitives.items()}
    link = bandwidth["permute"]
    codec = {}  # per format: the bytes/s of one ring hop, dequantize-add-quantize (bf16: add)
    m = 1 << 22
    local = jnp.ones(m, jnp.bfloat16)
    for name in sorted({fmt for _, fmt in spec["configs"]}):
        c = Codec(parse_format(name), jnp.bfloat16)
        wire = c.encode(jnp.ones(m, c.acc))  # a Message: payload and scales
        hop = jax.jit(lambda w, v, c=c: c.encode(c.decode(w, m) + v.astype(c.acc)))
        moved = 2 * encoded_bytes(m, c.fmt, c.dtype) + local.nbytes  # read, write, add
        codec[name] = moved / timed(f"codec {name}", hop, wire, local, repeats=5)

    def report(text):
        if host == 0:
            print(f"progress {text}", flush=True)

    runs = []
    for nbytes in spec["sizes"]:
        n = nbytes // 2
        x = global_array(_inputs(n, host))
        calls = {f"add {nbytes}": partial(jax.jit(lambda a: a + a), x.addressable_data(0))}
        for algorithm, fmt in spec["configs"]:
            key = f"{algorithm} {fmt} {nbytes}"
            reduce, sends, message_sizes = _programs(mesh, algorithm, fmt, n)
            compiled = reduce.lower(x).compile()
            bufs = [global_array(np.ones(size, np.uint8)) for size in message_sizes]
            sends = sends.lower(*bufs).compile()
            calls[key], calls[key + " wire"] = partial(compiled, x), partial(sends, *bufs)
            runs.append({"key": key, "algorithm": algorithm, "format": fmt,
                         "message_bytes": nbytes, "digest": _digest(
                             compiled(x).addressable_data(0)),
                         "hlo_bytes": round(sum(hlo_wire_bytes(compiled.as_text(), p).values())),
                         "wire_hlo_bytes": round(sum(hlo_wire_bytes(sends.as_text(), p).values())),
                         "model_bytes": wire_bytes(n, p, fmt=parse_format(fmt),
                                                   algorithm=algorithm, min_bytes=0)})
            report(f"compiled {algorithm} {fmt} {nbytes >> 20} MiB")
        width = len(calls)
        started = iter(range(width * spec["repeats"]))

        def turn(started=started, size=nbytes >> 20, width=width):  # barrier, progress
            i = next(started)
            if i % width == 0:
                report(f"{size} MiB, round {i // width + 1}/{spec['repeats']}")
            barrier()
        times.update(time_calls(calls, spec["repeats"], before=turn))
    with open(out, "w", encoding="utf-8") as f:
        json.dump({"calibration": {"memory_bytes_per_s": memory, "fresh_bytes_per_s": fresh,
                                   "hop_latency_s": latency,
                                   "link_bytes_per_s": link,
                                   **{f"primitive_bytes_per_s {k}": v
                                      for k, v in bandwidth.items()},
                                   **{f"codec_bytes_per_s {k}": v for k, v in codec.items()}},
                   "times": times, "runs": runs}, f)
    jax.distributed.shutdown()


def reference(spec_path: str, out: str) -> None:
    """One process, `hosts` simulated CPU devices, the same inputs and programs: digests."""
    with open(spec_path, encoding="utf-8") as f:
        spec = json.load(f)
    import jax
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ..devices import make_mesh, setup_devices

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


def _die_with(launcher: int) -> None:
    """Get SIGKILL when the launcher dies (Linux PR_SET_PDEATHSIG); if it already has, exit."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)
    if os.getppid() != launcher:
        os._exit(4)


def _watchdog(seconds: float) -> None:
    """End this process after `seconds` whatever it is doing (a daemon thread: it never keeps
    the process alive by itself)."""
    def expire():
        print(f"this host passed the run's time limit ({seconds:.0f} s)", file=sys.stderr,
              flush=True)
        os._exit(3)

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()


def main(argv: list[str]) -> None:
    """`worker SPEC COORDINATOR HOST OUT LAUNCHER_PID` or `reference SPEC OUT LAUNCHER_PID`:
    exits 0 after writing OUT, 1 (traceback on stderr) at the first error, 3 past the limit."""
    try:
        cmd, *rest = argv
        _die_with(int(rest.pop()))
        with open(rest[0], encoding="utf-8") as f:
            _watchdog(json.load(f)["timeout"])
        if cmd == "worker":
            worker(rest[0], rest[1], int(rest[2]), rest[3])
        elif cmd == "reference":
            reference(*rest)
        else:
            raise ValueError(f"unknown command {cmd!r}: worker or reference")
    except BaseException:  # any failure: the traceback, then out at once
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # JAX's exit handlers would wait for the other hosts: they are done or gone
