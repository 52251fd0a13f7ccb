"""Predicted quantities: what a collective will send, and how wrong it will be, before it runs.

Both are read off the `Schedule` that `collectives.all_reduce` executes, so they hold for any
schedule, not a hand formula per algorithm.

Bytes. One device sends, for every transfer it makes, the chunks it names, each encoded as whole
blocks of payload plus scales (`Format.nbytes`), after the padding of `schedule.layout`:

    wire_bytes = chunks sent by device 0  x  encoded bytes of one chunk

For the ring that is 2 (p - 1) chunks of n / p values: 2 (p - 1) / p * n * bits / 8 bytes, so
int8 with a bf16 scale per 32 (8.5 bits) sends 16 / 8.5 = 1.88x fewer bytes than bf16.

Error. Quantizing one value costs a relative RMS error `c = gaussian_relative_error(fmt)` (for
i.i.d. Gaussian data; about 0.55% for int8, 9.7% for int4, block 32, bf16 scale). A partial sum
of k inputs has k times an input's variance, and its quantization error scales with it; errors of
different quantizations are independent. So a value whose history went through quantized partial
sums of sizes k_1, k_2, ... ends with error variance c^2 s^2 sum(k_i), and relative to the exact
sum of p inputs (variance p s^2):

    relative error = c * sqrt(sum(k_i) / p)

`quantized_sizes` follows the schedule to find the k_i: a reduce hop quantizes the sender's
partial sum; an all-to-all or a reduce-phase all-gather quantizes every device's contribution,
its own included (the executor encodes the whole buffer); the gather phase quantizes each
owner's full sum once. Ring: 1, 2, ..., p - 1, then p, so c sqrt((p + 1) / 2). 2D torus (p1, p2):
each of the p2 rings of axis 0 quantizes its own partial sums, 1..p1-1 (for the values a device
received) plus p1 * (1..p2-1) along axis 1 and p1 p2 at the end. Two-shot: p ones and p: c sqrt(2).
One-shot: p ones: c.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from .._checks import count
from ..formats import Format
from ..quantize import dequantize, quantize
from ..schedule import Schedule, layout, make_schedule

__all__ = [
    "ALGORITHMS",
    "device_shape",
    "gaussian_relative_error",
    "predicted_relative_error",
    "quantized_sizes",
    "wire_bytes",
]

ALGORITHMS = ("psum", "ring", "bidir_ring", "two_shot", "one_shot")
RING_FAMILY = ("ring", "bidir_ring")


def device_shape(p) -> tuple[int, ...]:
    """`p` devices, or a (p1, p2) torus, as a shape of positive integers."""
    shape = tuple(p) if isinstance(p, (tuple, list)) else (p,)
    if not 1 <= len(shape) <= 2:
        raise ValueError(f"p must be a device count or a pair of them (2D torus), got {p!r}")
    return tuple(count(q, "p (devices)") for q in shape)


def check_algorithm(algorithm: str, fmt: Format | None, shape: tuple[int, ...] = (1,),
                    num_chunks: int = 1) -> None:
    """Refuse what `all_reduce` cannot run: unknown names, fmt with psum, 2D non-rings."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")
    if fmt is not None and not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format or None, got {type(fmt).__name__}")
    if algorithm == "psum" and fmt is not None:
        raise ValueError("algorithm='psum' is the built-in lax.psum and sends x unquantized: "
                         "pass fmt=None (or pick 'ring', 'bidir_ring', 'two_shot', 'one_shot')")
    if len(shape) == 2 and algorithm not in RING_FAMILY:
        raise ValueError(f"a pair of mesh axes (2D torus) takes {RING_FAMILY}, "
                         f"not {algorithm!r}")
    count(num_chunks, "num_chunks")
    if num_chunks > 1 and algorithm not in RING_FAMILY:
        raise ValueError(f"num_chunks (pipelining) applies to {RING_FAMILY}, not {algorithm!r}")


# ---- counts per schedule family, in closed form ------------------------------------------------
#
# A schedule lists every transfer, p^2 of them for a ring; a TPU v5p slice has 8,960 chips. The
# byte and error models therefore count in closed form what the schedules do. Both formulas are
# held in the tests against the schedule data (`Schedule.chunks_sent`, `_histories`) for every
# family and many p, so the executed schedule stays the one that is counted.


def _chunks_sent(algorithm: str, shape: tuple[int, ...]) -> int:
    """Chunk-sized messages one device sends (every device sends as many)."""
    if len(shape) == 2:  # torus: reduce along 0 (p2 chunks a hop), along 1, gather back
        p1, p2 = shape
        ring = 2 * p2 * (p1 - 1) + 2 * (p2 - 1)
        return 2 * ring if algorithm == "bidir_ring" else ring
    (p,) = shape
    return {"ring": 2 * (p - 1), "bidir_ring": 4 * (p - 1), "two_shot": 2 * (p - 1),
            "one_shot": p - 1}[algorithm]


def _size_sum(algorithm: str, shape: tuple[int, ...]) -> int:
    """Sum of the sizes of the quantized partial sums a value goes through (module essay)."""
    if len(shape) == 2:  # p2 column rings of 1..p1-1, then p1 * (1..p2-1), then p1 p2
        p1, p2 = shape
        return p2 * p1 * (p1 - 1) // 2 + p1 * p2 * (p2 - 1) // 2 + p1 * p2
    (p,) = shape
    return {"ring": p * (p + 1) // 2, "bidir_ring": p * (p + 1) // 2, "two_shot": 2 * p,
            "one_shot": p}[algorithm]


# ---- bytes ---------------------------------------------------------------------------------


def encoded_bytes(m: int, fmt: Format | None, dtype) -> int:
    """Bytes `m` values travel as: blocks of `fmt`, or raw `dtype` when fmt is None."""
    return m * jnp.dtype(dtype).itemsize if fmt is None else fmt.nbytes(m)


def wire_bytes(n: int, p, *, fmt: Format | None, algorithm: str, dtype="bfloat16",
               num_chunks: int = 1, min_bytes: int = 0, hop_bits: str = "uniform") -> int:
    """Bytes one device sends for an AllReduce of `n` values over `p` devices.

    Counted from the schedule `all_reduce` executes: every transfer of a device, encoded chunk
    sizes included (payload plus scales, after padding). `p` may be a pair (2D torus).
    "psum" is modelled as a ring, 2 (p - 1) / p * n values of `dtype` (XLA:CPU widens a bf16
    psum to f32 in practice; on TPU it sends bf16). An empty message sends nothing. A message
    under `min_bytes` (`all_reduce`'s size gate) is counted unquantized. `hop_bits` as in
    `all_reduce`: "adaptive" counts each step in its own format (`hops.hop_plan`). Stochastic
    rounding and rotation do not change the bytes.
    """
    n = count(n, "n (values)", minimum=0)
    if fmt is not None and n * jnp.dtype(dtype).itemsize < count(min_bytes, "min_bytes",
                                                                 minimum=0):
        fmt = None
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape, num_chunks)
    total = math.prod(shape)
    if algorithm == "psum":
        return 2 * (total - 1) * n * jnp.dtype(dtype).itemsize // total
    if total == 1:
        return 0
    chunks = 1 if algorithm == "one_shot" else total * (2 if algorithm == "bidir_ring" else 1)
    if fmt is not None and hop_bits != "uniform":
        from .hops import hop_plan, step_weights

        plan = hop_plan(p, fmt=fmt, algorithm=algorithm, hop_bits=hop_bits)
        _, pieces = layout(n, chunks, plan.align, num_chunks)
        steps, (_, gathered) = step_weights(make_schedule(algorithm, shape))
        sends = [(steps[t][1], f) for t, f in plan.reduce] + [(gathered, plan.gather)]
        return sum(k * sum(f.nbytes(m) for _, m in pieces) for k, f in sends if k)
    _, pieces = layout(n, chunks, fmt.block_size if fmt else 1, num_chunks)
    return _chunks_sent(algorithm, shape) * sum(encoded_bytes(m, fmt, dtype) for _, m in pieces)


# ---- error ---------------------------------------------------------------------------------


def _histories(sched: Schedule) -> list[tuple[int, ...]]:
    """For each chunk: sizes of the quantized partial sums its final value went through."""
    p, chunks = sched.p, sched.num_chunks
    # held[d][c] = (inputs summed, sizes of quantizations in its history)
    held = [[(1, ()) for _ in range(chunks)] for _ in range(p)]

    def sent(d, c):  # the receiver gets the sender's copy quantized
        k, hist = held[d][c]
        return k, (*hist, k)

    for step in (s for s in sched.steps if s.phase == "reduce"):
        if step.kind == "permute":
            arriving = [(t.dst, c, sent(t.src, c)) for t in step.transfers for c in t.chunks]
            for d, c, (k, hist) in arriving:
                k0, hist0 = held[d][c]
                held[d][c] = (k0 + k, hist0 + hist)
        else:  # all_to_all / all_gather: every contribution quantized, the receiver's own too
            incoming = {}
            for t in step.transfers:
                for c in t.chunks:
                    incoming.setdefault((t.dst, c), [(t.dst, c)]).append((t.src, c))
            new = {key: [sent(*src) for src in srcs] for key, srcs in incoming.items()}
            for (d, c), parts in new.items():
                held[d][c] = (sum(k for k, _ in parts), sum((h for _, h in parts), ()))
    return [sent(sched.owners[c][0], c)[1] if any(s.phase == "gather" for s in sched.steps)
            else held[0][c][1] for c in range(chunks)]


def quantized_sizes(p, *, algorithm: str) -> list[int]:
    """Sizes (inputs summed) of every quantized partial sum a value of chunk 0 went through.

    Read off the schedule (see the module essay): ring over 4 devices gives [1, 2, 3, 4];
    a (2, 2) torus ring [1, 1, 2, 4]; two-shot [1, 1, 1, 1, 4]; one-shot [1, 1, 1, 1].
    """
    shape = device_shape(p)
    check_algorithm(algorithm, None, shape)
    if algorithm == "psum":
        raise ValueError(f"psum quantizes nothing; choose one of {ALGORITHMS[1:]}")
    if math.prod(shape) == 1:  # one device sends nothing, so quantizes nothing
        return []
    return sorted(_histories(make_schedule(algorithm, shape))[0])


@functools.cache
def _gaussian_amax2(b: int) -> float:
    """E[amax^2] of b i.i.d. N(0, 1) values: integral_0^inf 2m (1 - erf(m / sqrt 2)^b) dm."""
    m = np.linspace(0.0, 12.0, 120001)
    erf = np.vectorize(math.erf)(m / math.sqrt(2.0))
    integrand = 2 * m * (1 - erf**b)
    return float(np.sum((integrand[1:] + integrand[:-1]) / 2) * (m[1] - m[0]))


@functools.cache
def gaussian_relative_error(fmt: Format, *, samples: int = 1 << 16, seed: int = 0) -> float:
    """Relative RMS error of one quantization of i.i.d. Gaussian values, ||x' - x|| / ||x||.

    Integer grids, in closed form. The step is s = u amax / qmax, u >= 1 the factor by which
    the scale is rounded up to its dtype (below 1 + 2^-7 for bf16). Every element but the
    block's largest has an error uniform over a step (variance s^2 / 12); the largest sits at
    qmax / u in steps, off the grid by e = qmax / u - round(qmax / u): about nothing for int4
    (7 / u rounds to 7), about uniform for int8 (127 / u spans [126, 127]). So

        rel^2 = E[amax^2] / qmax^2 * ((B - 1) / 12 * E[u^2] + E[u^2 e^2]) / B

    for x ~ N(0, 1), with E[amax^2] = integral_0^inf 2m (1 - erf(m / sqrt 2)^B) dm and the
    averages over u taken with the scale's mantissa log-uniform, both integrated numerically.
    Float grids have a step that follows each value's binade, and a power-of-two (E8M0) scale
    lands anywhere up to 2x above amax / qmax; there the constant is measured with this
    package's own quantizer on `samples` seeded Gaussian values.
    """
    count(samples, "samples", minimum=1024)
    if fmt.is_int and not fmt.is_mx:  # a power-of-two scale is up to 2x coarse: measured
        b, qmax = fmt.block_size, fmt.elem_max
        e_amax2 = _gaussian_amax2(b)
        frac = 7 if fmt.scale_dtype == "bfloat16" else 23  # fraction bits of the scale
        mant = np.exp(np.linspace(0.0, math.log(2.0), 200001))  # log-uniform in [1, 2)
        u = np.ceil(mant * 2.0**frac) / 2.0**frac / mant
        e = qmax / u - np.round(qmax / u)
        return math.sqrt(e_amax2 / qmax**2 * ((b - 1) / 12 * np.mean(u**2)
                                               + np.mean(u**2 * e**2)) / b)
    x = jax.random.normal(jax.random.key(seed), (samples,), jnp.float32)
    err = dequantize(quantize(x, fmt)) - x
    return float(jnp.linalg.norm(err) / jnp.linalg.norm(x))


def predicted_relative_error(p, *, fmt: Format | None, algorithm: str,
                             hop_bits: str = "uniform") -> float:
    """Expected ||all_reduce - exact|| / ||exact|| for i.i.d. Gaussian inputs (module essay).

    0.0 for `fmt=None`, "psum" and a single device (exact up to the rounding of the
    accumulation dtype, and nothing quantized). `p` may be a pair (2D torus). `hop_bits`:
    "adaptive" weighs each step's format by the partial sums it quantizes (`hops.py`).
    Rounding to nearest; a rotation leaves Gaussian data's error unchanged.
    """
    shape = device_shape(p)
    check_algorithm(algorithm, fmt, shape)
    total = math.prod(shape)
    if fmt is None or algorithm == "psum" or total == 1:
        return 0.0
    if hop_bits != "uniform":
        from .hops import hop_plan, plan_relative_error

        plan = hop_plan(p, fmt=fmt, algorithm=algorithm, hop_bits=hop_bits)
        return plan_relative_error(plan, p, algorithm=algorithm)
    return gaussian_relative_error(fmt) * math.sqrt(_size_sum(algorithm, shape) / total)
