"""The error model: how wrong a quantized AllReduce is, before it runs.

Error. Quantizing one value costs a relative RMS error `c = gaussian_relative_error(fmt)` (for
i.i.d. Gaussian data; the Concepts page tabulates it per format). A partial sum
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

`quantizations` reads those histories off the schedule with `schedule.walk`, the walk the
executor's data follows; `_size_sum` is the same count in closed form where the schedule's row
has one (`schedule.SCHEDULES`; a v5p slice has 8,960 chips: too many to walk), held equal to the
walk in the tests for every family and many p.
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
from ..schedule import SCHEDULES, Schedule, check_algorithm, device_shape, make_schedule, walk

__all__ = ["gaussian_relative_error", "quantizations", "quantized_sizes", "uniform_relative_error"]


def quantizations(sched: Schedule) -> list[tuple[tuple[int | None, int], ...]]:
    """For each chunk: (step time, inputs summed) of every quantization its final value went
    through, the gather phase's with time None (`schedule.walk` with counted histories)."""
    def send(value, time):  # a send quantizes the sender's partial sum of k inputs
        k, history = value
        return k, (*history, (time, k))

    held = walk(sched, lambda d, c: (1, ()), send, lambda a, b: (a[0] + b[0], a[1] + b[1]))
    return [held[0][c][1] for c in range(sched.chunk_count)]


def quantized_sizes(p, *, algorithm: str) -> list[int]:
    """Sizes (inputs summed) of every quantized partial sum a value of chunk 0 went through.

    Read off the schedule (see the module essay): ring over 4 devices gives [1, 2, 3, 4];
    a (2, 2) torus ring [1, 1, 2, 4]; two-shot [1, 1, 1, 1, 4]; one-shot [1, 1, 1, 1].
    """
    shape = device_shape(p)
    check_algorithm(algorithm, None, shape)
    if algorithm not in SCHEDULES:
        raise ValueError(f"psum quantizes nothing; choose one of {tuple(SCHEDULES)}")
    if math.prod(shape) == 1:  # one device sends nothing, so quantizes nothing
        return []
    return sorted(k for _, k in quantizations(make_schedule(algorithm, shape))[0])


def _size_sum(algorithm: str, shape: tuple[int, ...]) -> int:
    """Sum of the sizes of the quantized partial sums a value goes through (module essay): in
    closed form where the schedule's row has one (`schedule.SCHEDULES`), else walked."""
    closed = SCHEDULES[algorithm].sizes
    if closed is not None:
        return closed(shape)
    return sum(k for _, k in quantizations(make_schedule(algorithm, shape))[0])


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
    if not isinstance(fmt, Format):
        raise TypeError(f"fmt must be an equarx_ref.Format, got {fmt!r}")
    count(samples, "samples", minimum=1024)
    count(seed, "seed", minimum=0)
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


def uniform_relative_error(shape: tuple[int, ...], fmt: Format, algorithm: str) -> float:
    """c(fmt) sqrt(sum of the quantized sizes / p): one format on every hop (module essay)."""
    return gaussian_relative_error(fmt) * math.sqrt(_size_sum(algorithm, shape) / math.prod(shape))
