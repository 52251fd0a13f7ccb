"""The codec against memory: how fast it runs next to a plain pass over the same bytes.

A quantized AllReduce wins only if its codec is cheap beside the wire: every hop of a ring reads
a message, decodes it, adds this device's chunk and encodes the sum (`execute.py`), so a codec
that moves many times the bytes it must gives the bandwidth back. This module times the codec's
programs on whatever backend jax runs on (`jax.devices()[0]`), side by side in one run with the
cheapest pass over memory there is, `x + 1` (one read, one write; XLA removes `x * 1`):

    program   inputs                         output       fewest bytes (n values)
    x + 1     x: bf16[n]                     bf16[n]      2n + 2n
    x + 1     x: f32[n/2] (the same bytes)   f32[n/2]     2n + 2n
    a + b     a, b: bf16[n]                  bf16[n]      2n + 2n + 2n
    encode    x: bf16[n]                     message      2n + nbytes
    decode    message                        bf16[n]      nbytes + 2n
    hop       message, x: bf16[n]            message      nbytes + 2n + nbytes

with nbytes = `fmt.nbytes(n)`, the message's bytes (its payload and its scales, two arrays:
wire.py). "Fewest bytes" is what a
program must move at the least: each input read once and each output written once, at its
logical size (packed, untiled); what stays on chip (the hop's f32 sum) is free. Each program's
throughput is its fewest bytes over its time, GB/s, and the fraction of the copy bandwidth
measured in the same run (4n bytes over the faster `x + 1`'s time: XLA:CPU adds bf16 through
f32 conversions, which can make that pass compute-bound, where a TPU's or a GPU's is bound by
memory either way): 100% is a codec as cheap as a copy; decode writes bf16 as the gather phase does
(`Codec.decode(buf, m, dtype)`). Each program's time is also given over `a + b`'s, a bf16
ring's hop: a quantized hop that costs more than that plain add beside it must win it back on
the wire.

`quantizer_throughput`, the older table, times quantize + dequantize (`quantize.py`, f32 in
and out) of several formats against `x + 1` and against int8's in the same run: a lost fusion
shows there as a format far slower than int8. A timing says how fast, never whether the code
is right, so the ratios are printed and stored (data/bench.json), not asserted.

Timings are of this machine, its load and its backend (`time_calls`: medians of round-robin
calls); the same programs compiled for a TPU, and XLA:TPU's own count of their bytes, are
`tpu_bytes.py`.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import jax
import jax.numpy as jnp

from .._checks import count
from ..formats import Format
from ..quantize import dequantize, quantize
from ..wire import Codec, Message, message_shapes
from .timing import medians, time_calls

__all__ = ["BENCH_FORMATS", "PATHS", "PROGRAMS", "QDQ_FORMATS", "Program", "add_program",
           "codec_paths", "codec_programs", "codec_throughput", "gpu_programs", "kernel_programs",
           "plain_program", "quantizer_throughput", "throughput"]

#: The formats whose encode, decode and hop `equarx-ref bench` times (and `tpu_bytes` compiles).
BENCH_FORMATS = ("int8", "int4", "fp8_e4m3", "mxfp8", "mxfp4")
#: quantize + dequantize: the bench formats, then the variants the former unit-test guard held
#: against int8 (f32 and bf16 scales, the float grids).
QDQ_FORMATS = (*BENCH_FORMATS, "int8/f32", "int4/f32", "int4/b16", "fp8_e5m2", "fp4_e2m1",
               "fp8_e4m3/f32")
#: The codec programs, in table order.
PROGRAMS = ("encode", "decode", "hop")
#: The codec's paths: XLA's fusions of `wire.Codec`, the Mosaic codec's Pallas kernels (TPU),
#: the GPU codec's Pallas kernels (Triton; the 8-bit and 4-bit formats it codes).
PATHS = ("xla", "pallas", "gpu")


@dataclasses.dataclass(frozen=True)
class Program:
    """One program over n values: `fn(*args)`, `args` as dtype and shape (flat arrays, as the
    collectives hand the codec a chunk), and the fewest bytes it must move."""

    name: str
    fmt: str | None
    fn: Callable
    args: tuple[tuple[str, tuple[int, ...]], ...]
    fewest_bytes: int


def plain_program(n: int, dtype: str = "bfloat16") -> Program:
    """`x + 1` on the bytes of bf16[n] (as `dtype`): one read and one write, the copy every
    program is measured against. Its `fmt` names the dtype."""
    m = 2 * n // jnp.dtype(dtype).itemsize
    return Program("x + 1", jnp.dtype(dtype).name, lambda x: x + 1, ((dtype, (m,)),), 4 * n)


def add_program(n: int) -> Program:
    """`a + b` of two bf16[n]: two reads and one write, what a bf16 ring hop costs (the yardstick
    of a quantized hop: how much more than the plain add it replaces)."""
    values = ("bfloat16", (n,))
    return Program("a + b", "bfloat16", lambda a, b: a + b, (values, values), 6 * n)


def _message_args(fmt: Format, n: int) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The (dtype, shape) of a message's two arrays, n values of `fmt`."""
    (pb, rows), (g, _) = message_shapes(n, fmt)
    bits = {"bfloat16": "uint16", "float32": "uint32", "e8m0": "uint8"}[fmt.scale_dtype]
    return ("uint8", (pb, rows)), (bits, (g, rows))


def _programs(fmt: Format, n: int, encode, decode, hop, values) -> dict[str, Program]:
    """encode, decode and hop of `fmt` over n bf16 values, held as `values` (a shape: flat,
    or rows of 128), the message's arrays as separate arguments."""
    name, nbytes = str(fmt), fmt.nbytes(n)
    message, x = _message_args(fmt, n), ("bfloat16", values)
    return {
        "encode": Program("encode", name, lambda v: tuple(encode(v)), (x,), 2 * n + nbytes),
        "decode": Program("decode", name, lambda a, s: decode(Message(a, s)), message,
                          nbytes + 2 * n),
        "hop": Program("hop", name, lambda a, s, v: tuple(hop(Message(a, s), v)),
                       (*message, x), 2 * nbytes + 2 * n),
    }


def codec_programs(fmt: Format, n: int) -> dict[str, Program]:
    """encode, decode and one ring hop of `fmt` over n bf16 values (n whole rows of `fmt`),
    through `wire.Codec` as the collectives call it (flat values)."""
    codec = Codec(fmt, jnp.bfloat16)
    return _programs(fmt, n, codec.encode, lambda m: codec.decode(m, n, jnp.bfloat16),
                     lambda m, v: codec.encode(codec.decode(m, n) + v.astype(codec.acc)), (n,))


def kernel_programs(fmt: Format, n: int, *, interpret=False) -> dict[str, Program]:
    """encode, decode and hop of `fmt` over n bf16 values as the Mosaic codec's Pallas kernels
    (`kernels.codec`; `interpret` as theirs, False: compiled natively), the values as rows of
    128 (a bitcast of the flat array on a TPU)."""
    from ..kernels import codec  # Pallas loads only here

    return _programs(fmt, n, lambda v: codec.encode(v, fmt, interpret=interpret),
                     lambda m: codec.decode(m, fmt, jnp.bfloat16, interpret=interpret),
                     lambda m, v: codec.hop(m, v, fmt, interpret=interpret), (n // 128, 128))


def gpu_programs(fmt: Format, n: int, *, interpret=False) -> dict[str, Program]:
    """encode, decode and hop of `fmt` over n bf16 values as the GPU codec's Pallas kernels
    (`kernels.gpu`; `interpret` as theirs, False: compiled by Triton) on the flat message; none
    for a format it does not code (`gpu.supports`)."""
    from ..kernels import gpu  # Pallas loads only here

    if gpu.supports(fmt):  # the reason it does not code fmt
        return {}
    return _programs(fmt, n, lambda v: gpu.encode(v, fmt, interpret=interpret),
                     lambda m: gpu.decode(m, fmt, n, jnp.bfloat16, interpret=interpret),
                     lambda m, v: gpu.hop(m, v, fmt, interpret=interpret), (n,))


def _values(mib: int) -> int:
    """Values of bf16 in `mib` MiB (a multiple of every block size)."""
    return count(mib, "mib") << 19


def codec_paths(paths, known=PATHS) -> tuple[str, ...]:
    """`paths` as a tuple, each one of `known` (else one ValueError naming the unknown ones);
    what `codec_throughput` and `tpu_bytes` (the TPU's two) take."""
    paths = (paths,) if isinstance(paths, str) else tuple(paths)
    unknown = [p for p in paths if p not in known]
    if unknown:
        raise ValueError(f"unknown codec paths {unknown}: choose from {known}")
    return paths


def _paths(paths) -> tuple[str, ...]:
    """The codec paths to time: the XLA path, and the Pallas kernels where they run natively,
    the Mosaic codec's on a TPU and the GPU codec's on a GPU (an interpreter's time says
    nothing of a chip)."""
    if paths is None:
        from ..kernels.backend import on_tpu  # Pallas loads only here

        native = "pallas" if on_tpu() else "gpu" if jax.default_backend() == "gpu" else None
        return ("xla", native) if native else ("xla",)
    return codec_paths(paths)


def codec_throughput(mib: int = 64, *, formats=BENCH_FORMATS, repeats: int = 5,
                     paths=None) -> list[dict]:
    """encode, decode and hop of each format on `mib` MiB of bf16 against `x + 1` on it, all
    in one round-robin (`time_calls`) on the default device; `paths`: the XLA path's codec
    and, on a TPU (None), the Mosaic codec's kernels too (`kernel_programs`), on a GPU the GPU
    codec's (`gpu_programs`, for the formats it codes).

    Returns one row per program: {"path" ("xla", "pallas" or "gpu"), "program", "format" (for x + 1:
    its dtype), "mib", "n", "seconds" (median), "fewest_bytes", "gbps" (fewest bytes / seconds
    / 1e9), "of_copy" (gbps over "copy_gbps", the faster x + 1's), "to_add" (seconds over
    `a + b`'s, the plain bf16 hop)}; the two `x + 1` rows (bf16, f32) and `a + b` first.
    """
    n = _values(mib)
    x = jax.random.normal(jax.random.key(0), (n,), jnp.float32).astype(jnp.bfloat16)
    y = jax.random.normal(jax.random.key(1), (n,), jnp.float32).astype(jnp.bfloat16)
    progs = [("xla", plain_program(n)), ("xla", plain_program(n, "float32")),
             ("xla", add_program(n))]
    calls = {"x + 1": (jax.jit(progs[0][1].fn), (x,)),
             "x + 1 f32": (jax.jit(progs[1][1].fn), (x[: n // 2].astype(jnp.float32),)),
             "a + b": (jax.jit(progs[2][1].fn), (x, y))}
    for path in _paths(paths):
        make = {"xla": codec_programs,
                "pallas": functools.partial(kernel_programs, interpret=None),
                "gpu": functools.partial(gpu_programs, interpret=None)}[path]
        for name in formats:
            by_name = make(Format.parse(name), n)
            if not by_name:
                continue  # a format the GPU codec does not code
            values = x.reshape(by_name["encode"].args[0][1])  # flat, or the kernels' rows
            wire = jax.block_until_ready(jax.jit(by_name["encode"].fn)(values))  # real messages
            for prog in by_name.values():
                progs.append((path, prog))
                args = tuple(wire) if prog.name == "decode" else (values,) \
                    if prog.name == "encode" else (*wire, values)
                calls[f"{path} {prog.name} {prog.fmt}"] = (jax.jit(prog.fn), args)
    t = medians(time_calls({k: (lambda f=f, a=a: f(*a)) for k, (f, a) in calls.items()},
                           repeats))
    copy = 4 * n / min(t["x + 1"], t["x + 1 f32"]) / 1e9
    return [{"path": path, "program": p.name, "format": p.fmt, "mib": mib, "n": n,
             "seconds": s, "fewest_bytes": p.fewest_bytes, "gbps": p.fewest_bytes / s / 1e9,
             "of_copy": p.fewest_bytes / s / 1e9 / copy, "copy_gbps": copy,
             "to_add": s / t["a + b"]}
            for (path, p), s in zip(progs, t.values(), strict=True)]


def quantizer_throughput(mib: int = 64, *, formats=QDQ_FORMATS, repeats: int = 5) -> list[dict]:
    """quantize+dequantize of a `mib` MiB f32 array in each format, against `x + 1` on it and
    against int8's, in one round-robin.

    Returns one row per format: {"format", "mib", "quantize_dequantize_s", "elementwise_s",
    "ratio" (to x + 1), "to_int8" (to int8's quantize+dequantize; None without int8),
    "gib_per_s" (f32 input throughput)}.
    """
    x = jax.random.normal(jax.random.key(0), (count(mib, "mib") << 18,), jnp.float32)
    fmts = {str(Format.parse(f)): Format.parse(f) for f in formats}
    jitted = {name: jax.jit(lambda v, fmt=fmt: dequantize(quantize(v, fmt)))
              for name, fmt in fmts.items()}
    calls = {name: (lambda f=f: f(x)) for name, f in jitted.items()}
    plus1 = jax.jit(lambda v: v + 1)
    t = medians(time_calls({**calls, " x + 1": lambda: plus1(x)}, repeats))
    return [{"format": name, "mib": mib, "quantize_dequantize_s": t[name],
             "elementwise_s": t[" x + 1"], "ratio": t[name] / t[" x + 1"],
             "to_int8": t[name] / t["int8"] if "int8" in t else None,
             "gib_per_s": mib / 1024 / t[name]} for name in fmts]


def throughput(mibs=(64,), *, repeats: int = 5, formats=BENCH_FORMATS,
               qdq_formats=QDQ_FORMATS, paths=None) -> dict:
    """What `equarx-ref bench` measures at every size in `mibs`: {"device" (jax's device kind),
    "platform", "codec": `codec_throughput` rows, "quantizer": `quantizer_throughput` rows}."""
    mibs = [count(m, "mib") for m in mibs]
    device = jax.devices()[0]
    return {"device": device.device_kind, "platform": device.platform,
            "codec": [r for mib in mibs for r in codec_throughput(
                mib, formats=formats, repeats=repeats, paths=paths)],
            "quantizer": [r for mib in mibs for r in quantizer_throughput(
                mib, formats=qdq_formats, repeats=repeats)]}
