"""The quantizer against memory: how fast quantize + dequantize runs next to a plain pass.

`quantizer_throughput` times quantize+dequantize on a large array against the cheapest pass over
the same memory (`x + 1`: one read, one write; XLA removes `x * 1`), in the same run, so the
ratio says how many memory passes the quantizer costs on this machine. `throughput` is what
`equarx-ref bench` prints: that, for several formats and sizes. CPU timings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from .._checks import count
from ..formats import Format
from ..quantize import dequantize, quantize
from .timing import medians, time_calls

__all__ = ["BENCH_FORMATS", "quantizer_throughput", "throughput"]

#: The formats `equarx-ref bench` times.
BENCH_FORMATS = ("int8", "int4", "fp8_e4m3", "mxfp4")


def quantizer_throughput(fmt: Format, *, mib: int = 64, repeats: int = 5) -> dict:
    """quantize+dequantize of a `mib` MiB f32 array against `x + 1` on it, in the same run.

    Returns:
        {"format", "mib", "quantize_dequantize_s", "elementwise_s", "ratio", "gib_per_s"}:
        median seconds of each, their ratio, and the quantizer's f32 input throughput.
    """
    x = jax.random.normal(jax.random.key(0), (mib << 18,), jnp.float32)
    qdq, plus1 = jax.jit(lambda v: dequantize(quantize(v, fmt))), jax.jit(lambda v: v + 1)
    t = medians(time_calls({"qdq": lambda: qdq(x), "plus1": lambda: plus1(x)}, repeats))
    return {"format": str(fmt), "mib": mib, "quantize_dequantize_s": t["qdq"],
            "elementwise_s": t["plus1"], "ratio": t["qdq"] / t["plus1"],
            "gib_per_s": mib / 1024 / t["qdq"]}


def throughput(mibs=(64,), *, repeats: int = 5) -> list[dict]:
    """`quantizer_throughput` of every format in `BENCH_FORMATS` at every size in `mibs`."""
    mibs = [count(m, "mib") for m in mibs]
    return [quantizer_throughput(Format.parse(name), mib=mib, repeats=repeats)
            for mib in mibs for name in BENCH_FORMATS]
