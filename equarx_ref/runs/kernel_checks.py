"""Checking and timing the kernels: what `equarx-ref kernels` and the course call.

`check(p, fmt=..., algorithm=...)` runs the Pallas ring and the XLA path on the same inputs
over p devices and reports whether the results are bitwise equal and how many races the
detector saw (interpret mode; on a TPU the kernel runs natively and races are not observable,
reported as None). `check(..., sabotage="capacity")` runs the deliberately broken kernel: its
race count must not be 0.

`measure_hop(...)`, on a TPU only, times the Mosaic codec's hop kernel against the same hop
compiled by XLA and puts both beside the chip's HBM bandwidth: a hop reads the message and the
local values and writes the next message, (2 bits_per_element / 8 + local itemsize) bytes per
value, so

    GB/s = bytes moved / seconds,        fraction of HBM = GB/s / chip.hbm_bandwidth.

Off a TPU it refuses (a CPU figure would say nothing about the chip); `report()` then runs the
interpret-mode checks only and says so.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp
import numpy as np

from ..formats import Format, format_label
from ..kernels import backend, codec
from ..wire import decode, encode
from .timing import medians, time_calls

__all__ = ["HopTiming", "KernelCheck", "check", "measure_hop", "report"]


@dataclasses.dataclass(frozen=True)
class KernelCheck:
    """One run of the Pallas ring against the XLA path.

    Attributes:
        p, n, algorithm, format, num_chunks: the configuration (format as `format_label`).
        bitwise: the Pallas result equals impl="xla"'s bit for bit, on every device.
        races: races the detector reported (None natively on a TPU, where it does not run).
        max_error: largest |pallas - exact sum| (float64), for scale.
        seconds: wall time of the Pallas call (interpret mode: simulation, not speed).
        sabotage: the broken variant run, or None.
    """

    p: int
    n: int
    algorithm: str
    format: str
    num_chunks: int
    bitwise: bool
    races: int | None
    max_error: float
    seconds: float
    sabotage: str | None = None


def _inputs(p: int, n: int, seed: int) -> np.ndarray:
    x = np.array(jax.random.normal(jax.random.key(seed), (p, n), jnp.float32))
    x[:, : min(n, 32)] = 0.0  # an all-zero block
    return x


def _devices(p: int) -> list:
    """p devices for a ring: the default backend's if it has p (a TPU slice), else simulated
    CPU devices (a single-chip TPU, as on free Colab: the ring then runs in interpret mode)."""
    for devices in (jax.devices(), jax.devices("cpu")):
        if len(devices) >= p:
            return list(devices[:p])
    raise ValueError(f"p={p} needs {p} devices, have {len(jax.devices())} "
                     f"{jax.default_backend()} and {len(jax.devices('cpu'))} CPU devices "
                     "(call eq.setup_devices first)")


def check(p: int = 4, *, fmt: Format | None = Format.int8(), algorithm: str = "ring",  # noqa: B008
          n: int = 300, num_chunks: int = 2, sabotage: str | None = None, seed: int = 0,
          x: np.ndarray | None = None) -> KernelCheck:
    """Run `all_reduce(impl="pallas")` and `impl="xla"` on p devices and compare (the default
    backend's if it has p, else simulated CPU devices, in interpret mode).

    `x` ([p, n], one row per device) overrides the default inputs: N(0, 1) with a zero block.
    """
    from ..collectives import all_reduce
    from ..kernels.ring import ring_all_reduce

    x = _inputs(p, n, seed) if x is None else np.asarray(x)
    p, n = x.shape
    devices = _devices(p)
    mesh = jax.make_mesh((p,), ("ring",), devices=devices)
    spec = jax.sharding.PartitionSpec("ring")
    xs = jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))

    def run(body):
        return jax.jit(jax.shard_map(lambda v: body(v[0])[None], mesh=mesh, in_specs=spec,
                                     out_specs=spec))(xs)

    want = np.asarray(run(lambda v: all_reduce(v, "ring", fmt=fmt, algorithm=algorithm,
                                               num_chunks=num_chunks, min_bytes=0)))
    start = time.perf_counter()
    if devices[0].platform == "tpu":
        got, races = run(lambda v: ring_all_reduce(
            v, "ring", fmt=fmt, algorithm=algorithm, num_chunks=num_chunks,
            sabotage=sabotage)), None
        got = np.asarray(got)
    else:
        with backend.RaceLog() as log:
            got = np.asarray(run(lambda v: ring_all_reduce(
                v, "ring", fmt=fmt, algorithm=algorithm, num_chunks=num_chunks,
                interpret=backend.race_detecting(), sabotage=sabotage)))
        races = log.count
    seconds = time.perf_counter() - start
    bitwise = bool(np.array_equal(got.view(np.uint32), want.view(np.uint32)))
    exact = x.astype(np.float64).sum(0)
    with np.errstate(invalid="ignore"):
        err = float(np.nanmax(np.abs(got - exact))) if np.isfinite(got).any() else float("nan")
    return KernelCheck(p, n, algorithm, format_label(fmt), num_chunks, bitwise, races, err,
                       seconds, sabotage)


@dataclasses.dataclass(frozen=True)
class HopTiming:
    """The hop kernel against XLA's version of the same hop, on one TPU chip.

    Attributes:
        chip: the device kind (e.g. "TPU v5 lite").
        format: the wire format.
        values: values per call.
        bytes_moved: bytes one hop reads and writes.
        kernel_seconds, xla_seconds: median wall time per call.
        kernel_gbps, xla_gbps: bytes_moved / time, in GB/s.
        hbm_gbps: the chip's HBM bandwidth (cost.CHIPS), or None for an unknown chip.
        bitwise: the kernel's bytes equal XLA's.
    """

    chip: str
    format: str
    values: int
    bytes_moved: int
    kernel_seconds: float
    xla_seconds: float
    kernel_gbps: float
    xla_gbps: float
    hbm_gbps: float | None
    bitwise: bool


def measure_hop(fmt: Format = Format.int8(), *, rows: int = 1024, m: int = 8192,  # noqa: B008
                repeats: int = 20) -> HopTiming:
    """Time the Mosaic codec's hop kernel and XLA's hop on this TPU (bf16 local values, rows
    of 128; `rows x m` values). TPU only."""
    if not backend.on_tpu():
        raise RuntimeError("measure_hop times a TPU chip; this machine has none (backend "
                           f"{jax.default_backend()!r}): no TPU figure is made up here")
    from ..models.cost import CHIPS, DEVICE_KINDS

    kind = jax.devices()[0].device_kind
    k1, k2 = jax.random.split(jax.random.key(0))
    n = rows * m
    local = jax.random.normal(k1, (n // 128, 128), jnp.bfloat16)
    wire = jax.jit(lambda v: encode(v, fmt))(jax.random.normal(k2, (n,)))
    kernel = jax.jit(lambda w, v: codec.hop(w, v, fmt, interpret=False))
    xla = jax.jit(lambda w, v: encode(decode(w, fmt, n) + v.reshape(-1).astype(jnp.float32),
                                      fmt))
    bitwise = all(bool(jnp.array_equal(a, b)) for a, b in zip(kernel(wire, local),
                                                              xla(wire, local), strict=True))
    moved = 2 * fmt.nbytes(n) + local.size * local.dtype.itemsize
    t = medians(time_calls({"kernel": lambda: kernel(wire, local),
                            "xla": lambda: xla(wire, local)}, repeats))
    tk, tx = t["kernel"], t["xla"]
    chip = CHIPS.get(DEVICE_KINDS.get(kind, ""))
    return HopTiming(kind, format_label(fmt), rows * m, int(moved), tk, tx, moved / tk / 1e9,
                     moved / tx / 1e9, chip.hbm_bandwidth / 1e9 if chip else None, bitwise)


CHECKS = (  # (p, algorithm, format name, num_chunks, sabotage): a few seconds each, interpreted
    (2, "ring", "int8", 1, None),
    (4, "bidir_ring", "int4", 1, None),
    (8, "ring", "int8", 1, None),
    (3, "ring", "fp8_e4m3", 2, None),
    (4, "ring", "int8", 2, "early_read"),  # a race on every schedule: must be reported
)


#: Formats whose hop kernel `report` times on a TPU.
HOP_FORMATS = ("int8", "int4", "fp8_e4m3", "mxfp8", "mxfp4")


def report(progress=None) -> dict:
    """What `equarx-ref kernels` prints: the interpret-mode checks, and on a TPU the hop
    kernel's timing (or the error that stopped it). Whether the kernels compile for a TPU is
    `tpu_matrix.compile_matrix` (`equarx-ref kernels --compile v5e:2x4`), with libtpu."""
    say = progress or (lambda message: None)
    out = {"backend": jax.default_backend(), "tpu": backend.on_tpu(), "checks": [],
           "timings": [], "timing_errors": {}}
    for p, algorithm, name, k, sabotage in CHECKS:
        if p > max(len(jax.devices()), len(jax.devices("cpu"))):
            continue
        say(f"check p={p} {algorithm} {name}" + (f" sabotage={sabotage}" if sabotage else ""))
        result = check(p, fmt=Format.parse(name), algorithm=algorithm, num_chunks=k,
                       sabotage=sabotage, n=200)
        out["checks"].append(dataclasses.asdict(result))
    if backend.on_tpu():
        for name in HOP_FORMATS:
            say(f"timing the hop kernel, {name}")
            try:
                out["timings"].append(dataclasses.asdict(measure_hop(Format.parse(name))))
            except Exception as e:
                lines = str(e).splitlines() or [""]
                out["timing_errors"][name] = f"{type(e).__name__}: {lines[0]}"
    return out
